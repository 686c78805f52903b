"""Set hooks on a model's named intervention points for a ``with`` block (``attention.points``).

    with selfattn.hooks(model, {"blocks.1.attn.hook_z": fn}):   # fn(value, point) -> new value or None
        model("abcab")                                           # every forward, generate and trace

    with selfattn.capture(model, ["blocks.0.hook_resid_post"]) as seen:
        model("abcab")
    seen["blocks.0.hook_resid_post"]                             # (1, 6, d_model): the last call's value

Every intervention of selfattn (ablate, patch_heads, path patching, attribution, the live
app's knock-outs) is hooks on these points. The model's code and weights stay as they are;
after the block the model is exactly as before, also when the block raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch

from selfattn.attention.modules import MultiHeadAttention
from selfattn.attention.points import ATTENTION_POINTS, POINTS, LayerPoints, parse_point_name, point_name
from selfattn.errors import ModelError, OptionError, did_you_mean


def model_blocks(model) -> list:
    """The model's ``TransformerBlock``s, layer 0 first (its ``blocks``, or ``layers``).

    Raises:
        ModelError: the model has no attention layers of selfattn's.
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        blocks = getattr(model, "layers", None)
    found = list(blocks) if blocks is not None else []
    if not found or not all(isinstance(getattr(b, "attention", None), MultiHeadAttention) for b in found):
        raise ModelError(
            f"{type(model).__name__} has no attention layers of selfattn's: its heads can be read and changed in "
            "selfattn's models (load_pretrained, train, Transformer)")
    return found


def point_names(model) -> list[str]:
    """Every intervention point of the model, layer by layer, in the order a forward passes them.

    Args:
        model: one of selfattn's models.

    Returns:
        The full names, "blocks.0.hook_resid_pre", "blocks.0.attn.hook_q", ...

    Raises:
        ModelError: the model has no attention layers of selfattn's.
    """
    order = ("resid_pre", "q", "k", "v", "pattern", "z", "result", "attn_out", "mlp_out", "resid_post")
    return [point_name(layer, point) for layer in range(len(model_blocks(model))) for point in order]


def _placements(model, table: Mapping[str, object]) -> list[tuple[object, int, str, Callable]]:
    """(module, layer, short name, hook) for every hook of ``table``, checked against the model."""
    if not isinstance(table, Mapping):
        raise OptionError(f"hooks take a mapping of point names to functions, got {type(table).__name__}")
    blocks = model_blocks(model)
    placed = []
    for name, given in table.items():
        parsed = parse_point_name(name)
        if parsed is None:
            short = name.rsplit("hook_", 1)[-1] if isinstance(name, str) else ""
            hint = did_you_mean(short, POINTS) if short else ""
            raise OptionError(f"no intervention point {name!r}: they are named blocks.L.hook_resid_pre, "
                              f"blocks.L.attn.hook_q ... (selfattn.point_names(model) lists them){hint}")
        layer, point = parsed
        if layer >= len(blocks):
            raise OptionError(f"{name}: layer {layer} is out of range: this model has {len(blocks)} layers, "
                              f"0 to {len(blocks) - 1}")
        functions = list(given) if isinstance(given, (list, tuple)) else [given]
        for function in functions:
            if not callable(function):
                raise OptionError(f"the hook at {name} must be a function (value, point) -> value or None, "
                                  f"got {type(function).__name__}")
            block = blocks[layer]
            placed.append((block.attention if point in ATTENTION_POINTS else block, layer, point, function))
    return placed


@contextmanager
def hooks(model, table: Mapping[str, Callable | list]) -> Iterator:
    """Hooks on named intervention points for a ``with`` block: every forward, generate and trace runs through them.

    A hook is ``fn(value, point) -> new value or None``: ``value`` is the tensor at the
    point (shapes in ``selfattn.attention.points``), ``point`` a ``Point`` (its name and
    layer, the call's real tokens and cache length, the layer's heads and key/value
    heads). Returning a tensor of the same shape replaces the value; None leaves it.
    Several hooks at one point run in the order given; blocks nest.

    Args:
        model: one of selfattn's models (``load_pretrained``, ``train``, ``Transformer``).
        table: point name -> a hook, or a list of hooks.

    Yields:
        The model.

    Raises:
        ModelError: the model has no attention layers of selfattn's.
        OptionError: an unknown point name, a layer out of range, or a hook that is not a function.

    Examples:
        >>> import selfattn as sa
        >>> model = sa.load_pretrained("tiny-induction")
        >>> with sa.hooks(model, {"blocks.1.attn.hook_z": lambda z, point: z * 0}):
        ...     knocked = model("abcab").logits
        >>> bool((knocked != model("abcab").logits).any())
        True
    """
    placed = _placements(model, table)
    done = []
    try:
        for module, layer, point, function in placed:
            if module.points is None:
                attention = module if isinstance(module, MultiHeadAttention) else module.attention
                module.points = LayerPoints(layer, attention.config.n_heads, attention.config.n_kv_heads)
            module.points.add(point, function)
            done.append((module, point, function))
        yield model
    finally:
        for module, point, function in reversed(done):
            module.points.remove(point, function)
            if not module.points.hooks:
                module.points = None


@contextmanager
def capture(model, names) -> Iterator[dict[str, torch.Tensor]]:
    """Keep the values at some points for a ``with`` block.   -> {name: the last call's value, detached}

    Args:
        model: one of selfattn's models.
        names: the point names to keep (see ``point_names``).

    Yields:
        A dict, filled as the model runs: each name's value in the last call that passed it.

    Raises:
        ModelError: the model has no attention layers of selfattn's.
        OptionError: an unknown point name, or a layer out of range.
    """
    names = [names] if isinstance(names, str) else list(names)
    seen: dict[str, torch.Tensor] = {}

    def keep(value: torch.Tensor, point) -> None:
        seen[point.name] = value.detach()

    with hooks(model, {name: keep for name in names}):
        yield seen
