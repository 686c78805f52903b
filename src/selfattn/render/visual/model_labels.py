"""What the pictures of a pretrained model read from its trace: labels, hidden keys, its positions.

Every family goes through the same few questions, asked of the trace's records
(``AttentionInfo``: causal, window, positional) and never of the family's name:

    trace_labels(trace)       each token as it reads ('␣cat' for 'Ġcat')
    hidden_label(infos)       what the grey cells of a picture mean ("hidden by the causal mask")
    model_masks(trace)        which keys each layer lets each query see, as the trace recorded them

The matplotlib figures themselves are made in ``plots``; nothing here computes attention.
A model's position table and RoPE grids come from the model itself: ``commands.model_pictures``.
"""

from __future__ import annotations

import torch

from selfattn.models.description import AttentionInfo
from selfattn.render.visual.token_labels import token_labels


def trace_labels(trace) -> list[str]:
    """The tokens of any trace as pictures show them: a model's as they read, the toy's as they are."""
    model = trace.section("model")
    return token_labels(list(trace.tokens), None if model is None else model.readable)


def hidden_label(infos: list[AttentionInfo] | AttentionInfo) -> str:
    """What hides a key in these layers, for a legend: the causal mask and any sliding window."""
    infos = [infos] if isinstance(infos, AttentionInfo) else list(infos)
    windows = sorted({i.window for i in infos if i.window})
    if not any(i.causal for i in infos):
        return "masked"
    if not windows:
        return "hidden by the causal mask"
    sizes = " / ".join(str(w) for w in windows)
    every = all(i.window for i in infos)
    return f"hidden by the causal mask or {'the' if every else 'a layer’s'} sliding window ({sizes} newest keys)"


def model_masks(trace) -> tuple[torch.Tensor | None, ...]:
    """Every layer's (n, n) bool mask (True = may attend, None = every key) for a model trace.

    What the trace recorded from each layer's own steps (``AttentionTrace.masks``).
    """
    return trace.masks
