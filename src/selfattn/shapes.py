"""The one axis order used inside selfattn, and the names in shape comments.

    n       number of tokens in the sentence (seq)
    d       embedding width of one token (d_model)
    q_len   number of query rows, kv_len number of key/value rows, where they differ
    batch, heads, seq, d_head   the order of a 4-D tensor: (batch, heads, seq, d_head)

The seed's pipeline works on a single sentence, so its tensors are (n, d) for the
embeddings X, (n, n) for scores and weights, and (n, d) for the context vectors.
Every step function also accepts leading batch/head axes: (..., n, d).
"""
