"""The trace layer: records of every intermediate of attention, and the functions that fill them.

    seed.py           ``trace_self_attention`` -> ``Trace``: the seed's steps, loops and naive
                      softmax included
    variants.py       ``trace_variant`` -> ``VariantTrace``: one idea at a time (scaling, Q/K/V,
                      masks, heads, grouped heads, positions)
    variant_setup.py  the variants' defaults and their seeded, untrained projections
    flash_trace.py    the flash variant's block-by-block record, from the kernel's own steps
    model_trace.py    ``trace_model`` -> ``ModelTrace``: a loaded model's layer and head
    model_layers.py   its layers: every one's whole steps, or on a long text the chosen
                      one's and the others' rows (q, k, v, lse) through the tiled kernel

Records are plain data: they import no renderer, and the notebook display is registered
from above (``selfattn.render.visual.notebook``). Nothing here loads a model by name; the commands do.
"""
