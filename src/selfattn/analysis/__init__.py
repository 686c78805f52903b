"""What traces and model outputs mean: head roles, decoder head patterns, comparisons.

    head_roles.py      an encoder's heads: each word's weight on the previous, next, itself,
                       [CLS]/[SEP] or other tokens, and a role per head
    decoder_roles.py   a decoder's heads: previous-token, duplicate-token, induction and
                       first-token scores, and the induction probe
    comparison.py      one token in two sentences: per layer and head its top keys and
                       entropy, and a model's vectors' cosines

Above the traces and the models, below the renderers: they compute numbers from records
and hand records on; they neither load models by name nor write output.
"""
