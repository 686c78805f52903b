"""The input checks every attention entry point shares, below the kernels and the modules.

``scaled_dot_product_attention`` (attention/functional.py), ``flash_attention`` and
``flex_attention`` (kernels/), ring attention (distributed/) and the modules all take
query, key, value and a mask in one convention, (..., heads, seq, d) with broadcast
leading axes and optional grouped heads; they refuse the same bad inputs with the same
one-line errors, from here. Nothing here imports another part of the package except
``selfattn.errors``, so the kernels need not import the attention package nor it them.
"""

from __future__ import annotations

import sys
from itertools import zip_longest

import torch

from selfattn.errors import OptionError, ShapeError


def is_causal_bias(attn_mask) -> bool:
    """Whether attn_mask is one of torch's CausalBias objects (causal_upper_left / causal_lower_right).

    Importing torch.nn.attention.bias loads torch._dynamo (about 1.5 s), so we never
    import it ourselves: if the module is not loaded yet, no such object can exist.
    """
    module = sys.modules.get("torch.nn.attention.bias")
    return module is not None and isinstance(attn_mask, module.CausalBias)


def expand_kv_heads(key: torch.Tensor, value: torch.Tensor, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Repeat each key/value head for its group of query heads.   (..., Hk, kv_len, d) -> (..., Hq, kv_len, d)

    Query head h reads key/value head h // (Hq / Hk), as torch's enable_gqa does.
    """
    group = n_heads // key.shape[-3]
    if group == 1:
        return key, value
    key = key.repeat_interleave(group, dim=-3)  # (..., Hk * group, kv_len, d)
    value = value.repeat_interleave(group, dim=-3)  # (..., Hk * group, kv_len, d_v)
    return key, value


def check_attention_inputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    enable_gqa: bool,
) -> None:
    """Refuse inputs that do not fit together, naming the shapes, before any arithmetic."""
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor):
            raise ShapeError(f"{name} must be a tensor, got {type(tensor).__name__}")

    def shapes() -> str:  # built only for a message: every attention call passes here
        return f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"

    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if tensor.dim() < 2:
            raise ShapeError(f"{name} needs at least 2 dimensions (seq, d): {shapes()}")
        if not tensor.is_floating_point():
            raise ShapeError(f"{name} must be a floating-point tensor, got {tensor.dtype}")
    if not (query.dtype == key.dtype == value.dtype):
        raise ShapeError(
            f"query, key and value must share a dtype: {query.dtype}, {key.dtype}, {value.dtype}"
        )
    if query.shape[-1] != key.shape[-1]:
        raise ShapeError(f"query and key must have the same last dimension d: {shapes()}")
    if key.shape[-2] != value.shape[-2]:
        raise ShapeError(f"key and value must have the same length kv_len: {shapes()}")
    if key.shape[:-1] != value.shape[:-1]:
        raise ShapeError(f"key and value must have the same leading dimensions: {shapes()}")
    if enable_gqa:
        if query.dim() < 3 or key.dim() < 3:
            raise ShapeError(f"enable_gqa needs a heads dimension (..., heads, seq, d): {shapes()}")
        hq, hk = query.shape[-3], key.shape[-3]
        if hk == 0 or hq % hk:
            raise ShapeError(
                f"query heads ({hq}) must be a multiple of key/value heads ({hk}) for grouped-query attention: {shapes()}"
            )
    kv_lead = list(key.shape[:-2])
    if enable_gqa:
        kv_lead[-1] = query.shape[-3]
    lead = broadcast_shape(tuple(query.shape[:-2]), tuple(kv_lead))
    if lead is None:
        raise ShapeError(f"the batch/head dimensions of query and key/value do not broadcast: {shapes()}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise OptionError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if attn_mask is not None:
        if is_causal:
            raise OptionError("give either attn_mask or is_causal=True, not both (combine the masks first)")
        check_mask(attn_mask, query.dtype, (*lead, query.shape[-2], key.shape[-2]))


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of two shapes, or None if they do not broadcast.

    The rule of ``torch.broadcast_shapes``, written out because that function costs tens
    of microseconds per call, which showed in a profile of a small model's forward pass.
    """
    out = []
    for x, y in zip_longest(reversed(a), reversed(b), fillvalue=1):
        if x != y and x != 1 and y != 1:
            return None
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def check_mask(attn_mask: torch.Tensor, dtype: torch.dtype, scores_shape: tuple[int, ...]) -> None:
    """A mask must be bool, or float (float32 or the query's dtype), and broadcast to the scores' shape."""
    if not isinstance(attn_mask, torch.Tensor):
        raise ShapeError(f"attn_mask must be a tensor, got {type(attn_mask).__name__}")
    # torch takes bool, float32, or the query's dtype; so do we.
    if attn_mask.dtype not in (torch.bool, torch.float32, dtype):
        raise ShapeError(
            f"attn_mask must be bool (True = may attend) or float32/{str(dtype).removeprefix('torch.')} "
            f"(added to the scores), got {str(attn_mask.dtype).removeprefix('torch.')}"
        )
    if broadcast_shape(tuple(attn_mask.shape), scores_shape) != scores_shape:
        raise ShapeError(
            f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the scores' shape "
            f"{tuple(scores_shape)} (..., heads, q_len, kv_len)"
        )


def check_width(x: torch.Tensor, width: int, name: str) -> None:
    """x must be a tensor (batch, seq, width) or (seq, width); the message names its shape."""
    if not isinstance(x, torch.Tensor):
        raise ShapeError(f"{name} must be a tensor, got {type(x).__name__}")
    if x.dim() not in (2, 3) or x.shape[-1] != width:
        raise ShapeError(f"{name} must be (batch, seq, {width}) or (seq, {width}), got {tuple(x.shape)}")
