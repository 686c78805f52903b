"""The paths a ``MultiHeadAttention`` call can take, behind one signature, in a registry.

Every path is ``run(module, call)`` -> Y, or (Y, weights) when the call asks for them, and
``declines(module, call)`` -> why it cannot take this call (None: it can). The module owns
its projections, positions, cache and mask (``MultiHeadAttention.project_heads``) and looks
its path up: the first of its preference order (``path_order``) that does not decline.

    flash       the tiled kernel (``kernels.flash``): O(N) memory, the causal rule kept as a
                rule so that hidden tiles are skipped; chosen with attn_impl="flash"
    packed      training self-attention in one autograd function (``packed_attention``):
                Q, K and V projected head by head, nothing copied on the way
    reference   ``attention_forward``: the whole score matrix, every mask, the weights;
                it takes every call, so it comes last

``MultiHeadAttention.path_for(...)`` tells, without running anything, which path a call
takes and why each faster one declined it.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from selfattn.attention.functional import attention_forward
from selfattn.attention.packed_attention import packed_self_attention


class AttentionCall(NamedTuple):
    """The arguments of one ``MultiHeadAttention`` call, as every path receives them."""

    query: torch.Tensor
    key: torch.Tensor | None = None
    value: torch.Tensor | None = None
    attn_mask: torch.Tensor | None = None
    is_causal: bool = False
    cache: Any = None  # a KVCache, or None
    need_weights: bool = False
    positions: Any = None  # RoPE's positions, or a RopeRotation
    real_tokens: torch.Tensor | None = None  # (batch, q_len) bool: a padded batch's real tokens, for the points


class AttentionPath(NamedTuple):
    """One way to compute a ``MultiHeadAttention`` call.

    Attributes:
        name: how configs and ``path_for`` call it.
        declines: (module, call) -> why this path cannot take the call, or None.
        run: (module, call) -> Y (batch, q_len, d_model), or (Y, weights) with need_weights.
    """

    name: str
    declines: Callable[[Any, AttentionCall], str | None]
    run: Callable[[Any, AttentionCall], Any]


class PathChoice(NamedTuple):
    """Which path a call takes, and why each path before it in the order declined."""

    name: str
    declined: dict[str, str]


PATHS: dict[str, AttentionPath] = {}
"""name -> AttentionPath: every path a ``MultiHeadAttention`` can take."""


def register_path(path: AttentionPath) -> AttentionPath:
    """Add ``path`` to ``PATHS`` (a name already there is replaced).

    Args:
        path: the path.

    Returns:
        The path, registered.
    """
    PATHS[path.name] = path
    return path


def path_order(attn_impl: str) -> list[str]:
    """The paths a module with ``attn_impl`` tries, fastest first; "reference" takes what the others decline."""
    return [name for name in (attn_impl, "packed") if name != "reference"] + ["reference"]


def choose_path(module, call: AttentionCall) -> tuple[AttentionPath, PathChoice]:
    """The first path of the module's order that takes ``call``, and why the ones before it declined."""
    declined = {}
    for name in path_order(module.config.attn_impl):
        reason = PATHS[name].declines(module, call)
        if reason is None:
            return PATHS[name], PathChoice(name, declined)
        declined[name] = reason
    raise AssertionError("the reference path declined a call")  # it takes every call


# ----------------------------------------------------------------------------- reference


def _reference_declines(module, call: AttentionCall) -> str | None:
    return None


def _reference_run(module, call: AttentionCall):
    """The full score matrix through ``attention_forward``: every mask, RoPE, the cache, the weights."""
    # The causal rule alone, with as many queries as keys (training, a prompt without a cache):
    # bottom-right is top-left there, and attention_forward applies it without a mask tensor.
    square = call.is_causal and module.causal_alone(call.attn_mask) and _as_many_keys(call)
    heads = module.project_heads(call.query, call.key, call.value, call.attn_mask, call.is_causal and not square,
                                 call.cache, call.positions, fast=True, real_tokens=call.real_tokens)
    pattern = heads.call is not None and "pattern" in module.points  # a hook reads or changes the weights
    attended = attention_forward(
        heads.q, heads.k, heads.v, attn_mask=heads.mask, dropout_p=module.dropout_p, is_causal=square,
        scale=heads.scale, enable_gqa=module.grouped, need_weights=call.need_weights or pattern,
    )  # output (batch, H, q_len, d_head), weights (batch, H, q_len, kv_len) or None
    if pattern:
        attended = attended._replace(weights=module.points.apply("pattern", attended.weights, heads.call))
        attended = attended._replace(output=module.attend_with(attended.weights, heads.v))
    output = module.heads_out(attended.output, heads.call)[1]  # (batch, q_len, d_model)
    if heads.unbatched:
        output = output[0]
    if not call.need_weights:
        return output
    return output, attended.weights[0] if heads.unbatched else attended.weights


def _as_many_keys(call: AttentionCall) -> bool:
    """Whether a call attends to as many keys (cached and its own) as it has queries; False
    for inputs without a sequence axis (``project_heads`` then says what is wrong with them)."""
    query, key = call.query, call.query if call.key is None else call.key
    if not (isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) and query.dim() >= 2 and key.dim() >= 2):
        return False
    return key.shape[-2] + (0 if call.cache is None else call.cache.length) == query.shape[-2]


# ----------------------------------------------------------------------------- flash


def _flash_declines(module, call: AttentionCall) -> str | None:
    if module.points is not None and "pattern" in module.points:
        return "a hook is set on the layer's attention pattern, which the tiled kernel never holds"
    if call.need_weights:
        return "the call asks for the weights (need_weights=True), which the tiled kernel never holds"
    q_len = call.query.shape[-2] if isinstance(call.query, torch.Tensor) and call.query.dim() >= 2 else 0
    least = module.config.flash_min_queries
    if q_len < least:
        return f"{q_len} new queries, fewer than flash_min_queries ({least}): a short call is faster on the reference path"
    return None


def _flash_run(module, call: AttentionCall):
    """Y through the tiled kernel. A causal mask alone stays a causal mask (bottom-right), so
    the kernel skips the future's blocks; with other masks, a window or ALiBi it gets one
    combined mask."""
    from selfattn.kernels.flash import flash_with_offset  # the kernel loads with its first call

    alone = call.is_causal and module.causal_alone(call.attn_mask)
    heads = module.project_heads(call.query, call.key, call.value, call.attn_mask, call.is_causal and not alone,
                                 call.cache, call.positions, fast=True, real_tokens=call.real_tokens)
    offset = heads.k.shape[-2] - heads.q.shape[-2] if alone else None  # bottom-right: the queries are the newest
    out, _ = flash_with_offset(heads.q, heads.k, heads.v, heads.mask, offset, heads.scale, module.grouped,
                               dropout_p=module.dropout_p)
    output = module.heads_out(out, heads.call)[1]  # (batch, H, q_len, d_head) -> (batch, q_len, d_model)
    return output[0] if heads.unbatched else output


# ----------------------------------------------------------------------------- packed


def _packed_declines(module, call: AttentionCall) -> str | None:
    """Training self-attention only: gradients wanted, no mask but the causal rule, no cache,
    RoPE, ALiBi, window, q/k norm, dropout, grouped heads or returned weights."""
    # One test after another, so that a decoding step (declined here on every call) builds
    # no message it does not return: at width 64 the f-strings alone showed in a profile.
    c = module.config
    if module.points is not None:
        return "hooks are set on the layer's intervention points"
    if call.need_weights:
        return "the call asks for the weights"
    if call.attn_mask is not None:
        return "the call has a mask"
    if call.cache is not None:
        return "the call extends a KV cache"
    if call.positions is not None or c.positional != "none":
        return f"the module's positional setting is {c.positional!r}"
    if c.sliding_window is not None:
        return "the module has a sliding window"
    if c.qk_norm:
        return "the module normalises each head's q and k (qk_norm)"
    if module.grouped:
        return "the module has grouped key/value heads"
    if module.dropout_p != 0:
        return "dropout is on"
    if not ((call.key is None or call.key is call.query) and (call.value is None or call.value is call.query)):
        return "it is cross-attention"
    x = call.query
    if not (isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[1] > 0 and x.shape[-1] == c.d_model):
        return "the query is not one batch (batch, seq, d_model) of at least one token"
    params = (module.w_q.weight, module.w_k.weight, module.w_v.weight)
    if not (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params))):
        return "no gradient is wanted: the packed path is for training"
    if x.dtype not in (torch.float32, torch.float64) or x.dtype != params[0].dtype:
        return f"the query is {x.dtype} and the weights {params[0].dtype}: the packed path takes float32 or float64, alike"
    return None


def _packed_run(module, call: AttentionCall):
    """Y for training self-attention through ``packed_self_attention``: the same math as the
    reference path, with no head copied on its way to the batched products. It scales the
    scores by 1 / sqrt(d_head); a config's own scale s reaches it through W_q (and b_q)
    multiplied by s sqrt(d_head), inside the graph so that the gradients see it."""
    module.forget_stack()  # the optimiser step that follows may not bump the weights' versions
    c = module.config
    linears = (module.w_q, module.w_k, module.w_v)
    weights = [lin.weight for lin in linears]
    biases = [lin.bias for lin in linears] if c.bias else None
    if c.scale is not None:
        factor = c.scale * c.d_head ** 0.5
        weights[0] = weights[0] * factor
        if biases is not None:
            biases[0] = biases[0] * factor
    concat = packed_self_attention(call.query, tuple(weights), biases and tuple(biases), c.n_heads, call.is_causal)
    return module.w_o(concat)  # (batch, seq, H d_head) -> (batch, seq, d_model)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, d_head) -> (batch, seq, heads * d_head): the concat of the heads."""
    return x.transpose(1, 2).flatten(2)  # (batch, seq, heads, d_head) -> (batch, seq, heads * d_head)


register_path(AttentionPath("reference", _reference_declines, _reference_run))
register_path(AttentionPath("flash", _flash_declines, _flash_run))
register_path(AttentionPath("packed", _packed_declines, _packed_run))
