"""``selfattn patch -o FILE.png`` and ``selfattn attribute -o FILE.png``: a number per head, as a layers x heads heatmap.

A diverging map centred on 0: blue where patching the head brings the clean answer back
(up to 1 and past it), red where it pushes the answer further away; each cell printed.
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from selfattn.render.visual.figure_parts import new_figure, quiet_glyphs


def heads_grid(values: np.ndarray, title: str, label: str, reach: float) -> Figure:
    """A layers x heads grid of numbers on a diverging map centred on 0 (blue above, red below), each cell printed."""
    layers, heads = values.shape
    fig = new_figure(max(4.0, 1.0 + 0.8 * heads), max(2.5, 1.2 + 0.3 * layers if layers > 8 else 1.2 + 0.6 * layers))
    ax = fig.subplots()
    image = ax.imshow(values, cmap="RdBu", norm=TwoSlopeNorm(vcenter=0.0, vmin=-reach, vmax=reach), aspect="auto")
    for layer in range(layers):
        for head in range(heads):
            v = values[layer, head]
            ax.text(head, layer, f"{v:.2f}", ha="center", va="center", fontsize=8 if layers <= 12 else 6,
                    color="white" if abs(v) > 0.6 * reach else "black")
    ax.set_xticks(range(heads), [str(h) for h in range(heads)])
    ax.set_yticks(range(layers), [str(layer) for layer in range(layers)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, label=label)
    return fig


@quiet_glyphs
def patching_figure(data: dict) -> Figure:
    """The heatmap of ``data["recovered"]`` (layers x heads), from ``explain.interventions.patching_to_dict``.

    Returns:
        A figure with one image whose array is the recovered fractions, layer 0 on top.
    """
    values = np.asarray(data["recovered"], dtype=float)  # (layers, heads)
    target = data["target"]["text"]
    return heads_grid(values, f"{data['model']}: share of the target {target!r} recovered by patching each head",
                      "(lp_patched - lp_corrupted) / (lp_clean - lp_corrupted)", max(1.0, float(np.abs(values).max())))


@quiet_glyphs
def attribution_figure(data: dict) -> Figure:
    """Each head's share of the target's logit (layers x heads), from ``explain.interventions.attribution_to_dict``.

    Returns:
        A figure with one image whose array is the heads' shares, layer 0 on top.
    """
    layers = 1 + max(h["layer"] for h in data["heads"])
    heads = 1 + max(h["head"] for h in data["heads"])
    values = np.zeros((layers, heads))
    for h in data["heads"]:
        values[h["layer"], h["head"]] = h["logit"]
    target = data["target"]["text"]
    return heads_grid(values, f"{data['model']}: each head's share of the logit of {target!r} "
                      f"(position {data['position']})", "share of the logit",
                      max(1e-6, float(np.abs(values).max())))
