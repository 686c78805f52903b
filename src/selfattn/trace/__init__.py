"""The trace layer: records of every intermediate of attention, and the functions that fill them.

    record.py         ``AttentionTrace``: the one record every function below returns
    seed.py           ``trace_self_attention``: the seed's steps, loops and naive softmax
                      included
    variants.py       ``trace_variant``: one idea at a time (scaling, Q/K/V, masks, heads,
                      grouped heads, positions)
    variant_setup.py  the variants' defaults and their seeded, untrained projections
    flash_trace.py    the flash variant's block-by-block record, from the kernel's own steps
    model_trace.py    ``trace_model``: a loaded model's layer and head
    model_layers.py   its layers: every one's whole steps, or on a long text the chosen
                      one's and the others' rows (q, k, v, lse) through the tiled kernel

``old_views.py`` answers the names the records' old views (``Trace``, ``VariantTrace``,
``ModelTrace``) gave their fields, for one release, with a warning.
Records are plain data: they import no renderer, and the notebook display is registered
from above (``selfattn.render.visual.notebook``). Nothing here loads a model by name; the commands do.
"""
