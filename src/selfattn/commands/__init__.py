"""The commands: the only layer that resolves names, loads models, reads run folders and builds traces.

    explain_options.py ``ExplainConfig``: what one explanation is asked to do, validated
    traces.py          ``build_trace``: a config to its record (the seed, a variant, a model)
    explain.py         ``selfattn explain``: the record to text, markdown or JSON
    plot.py            ``selfattn plot`` and ``view`` for a sentence: pictures and pages
    block_map.py       ``plot --kind mask --length``: a mask's block map, no sentence
    training_pictures.py  ``plot`` and ``view --training``: a run's folder read back and drawn
    heads.py           ``selfattn heads``: every head's role or pattern scores
    similarity.py      ``selfattn similarity``: sentence vectors' cosines
    generate.py        ``selfattn generate``: a decoder continues a prompt
    compare.py         ``selfattn compare`` and ``compare()``: one token in two sentences
    train.py           ``selfattn train``

Each takes names and options, does the loading and computing through the layers below,
and hands records to the renderers (``render/text/``, ``render/visual/``), which only write.
"""
