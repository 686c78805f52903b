"""Named intervention points: where a forward pass can be read or changed, layer by layer.

Every layer of a transformer built from ``TransformerBlock`` offers these points, named as
TransformerLens names its hook points (their axes are ours: heads before positions):

    blocks.{l}.hook_resid_pre      (batch, seq, d_model)       the residual stream entering block l
    blocks.{l}.attn.hook_q         (batch, H, seq, d_head)     queries: projected, q-normed, turned by RoPE
    blocks.{l}.attn.hook_k         (batch, Hkv, seq, d_head)   this call's keys, likewise (before the cache)
    blocks.{l}.attn.hook_v         (batch, Hkv, seq, d_head)   this call's values (before the cache)
    blocks.{l}.attn.hook_pattern   (batch, H, seq, kv_len)     the attention weights A = softmax(scores)
    blocks.{l}.attn.hook_z         (batch, H, seq, d_head)     each head's output z_h = A_h V_g(h)
    blocks.{l}.attn.hook_result    (batch, seq, H, d_model)    each head's part of the output, z_h W_o,h (no bias)
    blocks.{l}.hook_attn_out       (batch, seq, d_model)       what attention adds to the stream (after a post-norm)
    blocks.{l}.hook_mlp_out        (batch, seq, d_model)       what the feed-forward network adds
    blocks.{l}.hook_resid_post     (batch, seq, d_model)       the residual stream leaving block l

Note the one difference from TransformerLens: hook_q and hook_k are after RoPE (its
hook_rot_q / hook_rot_k). Query head h reads key/value head g(h) = h // (H / Hkv), so a
change at hook_k or hook_v reaches every query head of its group.

A hook is ``fn(value, point) -> new value or None`` (None: unchanged); ``point`` is a
``Point`` telling it where it is and what the call is: the layer, the real tokens of a
padded batch, how many tokens the cache held before the call. Hooks are set on a model for
a ``with`` block by ``selfattn.hooks`` (``analysis.hooks``); a layer with none set runs
exactly as before, on its fastest path.
"""

from __future__ import annotations

import re
from typing import Callable, NamedTuple

import torch

from selfattn.errors import ShapeError
from selfattn.renamed import renamed_attribute

ATTENTION_POINTS = ("q", "k", "v", "pattern", "z", "result")  # the attention module's: blocks.{l}.attn.hook_{point}
BLOCK_POINTS = ("resid_pre", "attn_out", "mlp_out", "resid_post")  # the block's: blocks.{l}.hook_{point}
POINTS = ATTENTION_POINTS + BLOCK_POINTS
_NAME = re.compile(r"blocks\.(\d+)\.(attn\.)?hook_([a-z_]+)")


class Point(NamedTuple):
    """Where a hook is called, and what it needs to know about the call.

    Attributes:
        name: the point's full name, "blocks.3.attn.hook_z".
        layer: the layer, from 0.
        point: the short name, "z".
        real: (batch, seq) bool, True at this call's real tokens of a padded batch; None
            when every position is a real token.
        past: how many tokens the layer's key/value cache held before this call (0 without
            a cache): the call's positions are past .. past + seq - 1.
        n_heads: query heads H of the layer.
        n_kv_heads: key/value heads Hkv of the layer (``.kv_heads`` still reads it and
            warns: its old name).
    """

    name: str
    layer: int
    point: str
    real: torch.Tensor | None
    past: int
    n_heads: int
    n_kv_heads: int

    def kv_head(self, head: int) -> int:
        """The key/value head a query head reads: head // (H / Hkv).

        Args:
            head: a query head of the layer.

        Returns:
            Its key/value head.
        """
        return head // (self.n_heads // self.n_kv_heads)

    def query_heads(self, kv_head: int) -> list[int]:
        """The query heads that read one key/value head (a change at hook_k or hook_v reaches them all).

        Args:
            kv_head: a key/value head of the layer.

        Returns:
            Its query heads, in order.
        """
        group = self.n_heads // self.n_kv_heads
        return list(range(kv_head * group, (kv_head + 1) * group))


renamed_attribute(Point, "kv_heads", "n_kv_heads")


class PointCall(NamedTuple):
    """What one call tells every point it passes: the real tokens and the cache's length before it."""

    real: torch.Tensor | None  # (batch, seq) bool, or None: all real
    past: int


Hook = Callable[[torch.Tensor, Point], "torch.Tensor | None"]


def point_name(layer: int, point: str) -> str:
    """The full name of a point: point_name(3, "z") == "blocks.3.attn.hook_z"."""
    return f"blocks.{layer}.{'attn.' if point in ATTENTION_POINTS else ''}hook_{point}"


def parse_point_name(name: str) -> tuple[int, str] | None:
    """(layer, short name) of a full point name, or None when it is not one."""
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        return None
    layer, in_attention, point = int(match.group(1)), match.group(2) is not None, match.group(3)
    if point not in (ATTENTION_POINTS if in_attention else BLOCK_POINTS):
        return None
    return layer, point


class LayerPoints:
    """The hooks set on one module (a block or its attention), by short point name, in the order set."""

    def __init__(self, layer: int, n_heads: int, n_kv_heads: int) -> None:
        self.layer, self.n_heads, self.n_kv_heads = layer, n_heads, n_kv_heads
        self.hooks: dict[str, list[Hook]] = {}

    def __contains__(self, point: str) -> bool:
        return point in self.hooks

    def add(self, point: str, hook: Hook) -> None:
        self.hooks.setdefault(point, []).append(hook)

    def remove(self, point: str, hook: Hook) -> None:
        """Take one hook off (the one set last, when it was set twice)."""
        found = self.hooks.get(point, [])
        for i in range(len(found) - 1, -1, -1):
            if found[i] is hook:
                del found[i]
                break
        if not found:
            self.hooks.pop(point, None)

    def apply(self, point: str, value: torch.Tensor, call: PointCall) -> torch.Tensor:
        """``value`` after every hook set at ``point``, in order; a hook may not change its shape."""
        for hook in self.hooks.get(point, ()):
            where = Point(point_name(self.layer, point), self.layer, point, call.real, call.past,
                          self.n_heads, self.n_kv_heads)
            changed = hook(value, where)
            if changed is None:
                continue
            if not isinstance(changed, torch.Tensor) or changed.shape != value.shape:
                got = tuple(changed.shape) if isinstance(changed, torch.Tensor) else type(changed).__name__
                raise ShapeError(f"a hook at {where.name} must return a tensor of shape {tuple(value.shape)} "
                                 f"(or None), got {got}")
            value = changed.to(value.dtype)
        return value
