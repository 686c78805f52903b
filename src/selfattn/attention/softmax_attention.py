"""The reference attention with its backward written out, for training at short contexts.

    forward     S = scale Q K^T + mask (a bool mask: -inf where False; causal: above the
                diagonal), P = softmax(S), O = P V
    backward    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),  D = rowsum(dO * O),
                dQ = scale dS K,  dK = scale dS^T Q

autograd through the plain steps (``attention_steps``) records each of them, keeps a
(q_len, kv_len) tensor for most and runs a backward for every one; here the forward works
in place on one score matrix and keeps only P, and the backward is the products above.
D = rowsum(dP * P) = rowsum(dO * O) because O = P V: FlashAttention-2's trick, a (q_len,
d) product instead of a (q_len, kv_len) one. The exp is ``exp_flush_tiny_``, which keeps
torch's CPU exp off its slow path for -inf (the masked keys) and other huge negatives.
The math is two functions on folded heads, ``attend_folded`` and ``attend_folded_backward``,
which ``packed_attention`` (a training step's self-attention) shares. A causal rule or a
single (q_len, kv_len) mask is added by the score product itself (``torch.baddbmm``).

Measured (12 x 4 heads, 64 tokens, head width 32, float32, one thread, forward + backward):
SDPA 1.28 ms, the plain steps through autograd 2.69 ms, this 1.30-1.40 ms.

The backward is once-differentiable: a second derivative raises instead of being wrong.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from selfattn.kernels.online_softmax import exp_flush_tiny_
from selfattn.masks import causal_mask


def softmax_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, attn_mask: torch.Tensor | None, is_causal: bool
) -> torch.Tensor:
    """O = softmax(scale Q K^T + mask) V with the backward above.   (..., q_len, d), (..., kv_len, d), (..., kv_len, d_v) -> (..., q_len, d_v)

    Every row must see a key (``takes_written_out_backward`` checks it): kv_len >= 1, a bool
    mask with a True in every row or a finite float mask, and the causal rule top-left (row
    i sees keys 0..i).

    Args:
        query: Q, (..., q_len, d).
        key: K, (..., kv_len, d), the same heads as Q.
        value: V, (..., kv_len, d_v).
        scale: the factor on Q K^T.
        attn_mask: None, bool (True = may attend) or float (added), broadcastable to the scores.
        is_causal: query i sees keys j <= i.

    Returns:
        O, (..., q_len, d_v).
    """
    return _SoftmaxAttention.apply(query, key, value, scale, attn_mask, is_causal)


def takes_written_out_backward(query, key, value, attn_mask, dropout_p: float, need_weights: bool) -> bool:
    """Whether a call may take ``softmax_attention``: every row sees a key, no dropout, no
    weights returned, Q, K, V with the same leading axes, a mask that needs no gradient and
    broadcasts to the scores' shape without widening it.

    Returns:
        True when it may.
    """
    same_axes = query.shape[:-2] == key.shape[:-2] == value.shape[:-2]
    if dropout_p != 0 or need_weights or not same_axes or key.shape[-2] == 0 or query.dtype not in (torch.float32, torch.float64):
        return False
    if attn_mask is None:
        return True
    if not isinstance(attn_mask, torch.Tensor) or attn_mask.requires_grad:
        return False
    scores = (*query.shape[:-1], key.shape[-2])
    try:
        if torch.broadcast_shapes(attn_mask.shape, scores) != scores:
            return False
    except RuntimeError:
        return False
    if attn_mask.dtype == torch.bool:
        return bool(attn_mask.any(dim=-1).all())  # a row with no key: the plain steps' answer stands
    return attn_mask.dtype == query.dtype and bool(torch.isfinite(attn_mask).all())


class _SoftmaxAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, scale, attn_mask, is_causal):
        # The leading axes fold into one for torch.bmm, (..., n, d) -> (N, n, d), in the order the
        # tensors are stored: heads laid out head by head fold as they are; heads split from
        # (batch, seq, heads, d) are strided and copied once here, or every product below (and
        # in the backward) would copy them again.
        fold = _Fold.of(query, key, value)
        q, k, v = fold.fold(query), fold.fold(key), fold.fold(value)  # (N, q_len, d), (N, kv_len, d), (N, kv_len, d_v)
        bias = _additive(attn_mask, is_causal, query.shape[-2], key.shape[-2], query)
        out, probs = attend_folded(q, k, v, scale, bias, fold.unfold)
        ctx.save_for_backward(q, k, v, probs, out)
        ctx.scale, ctx.fold = scale, fold
        return fold.unfold(out)  # (..., q_len, d_v), stored like the inputs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, probs, out = ctx.saved_tensors
        fold = ctx.fold
        grads = attend_folded_backward(q, k, v, probs, out, fold.fold(grad_out), ctx.scale)
        return (*(fold.unfold(g) for g in grads), None, None, None)


def attend_folded(q, k, v, scale: float, bias: torch.Tensor | None, logical=None):
    """(O, P): P = softmax(scale Q K^T + bias), O = P V on folded heads.   (N, q_len, d), (N, kv_len, d), (N, kv_len, d_v) -> (N, q_len, d_v), (N, q_len, kv_len)

    Args:
        q, k, v: Q, K, V with their leading axes folded into one (contiguous).
        scale: the factor on Q K^T.
        bias: None, a (q_len, kv_len) bias for every head, or one broadcastable to the
            unfolded scores; every row must keep a finite score.
        logical: (N, q_len, kv_len) -> the unfolded view of the scores, for a bias of more
            than (q_len, kv_len).

    Returns:
        O and P, both kept by the backward.
    """
    q_len, kv_len = q.shape[-2], k.shape[-2]
    if bias is not None and bias.numel() == q_len * kv_len:
        # One (q_len, kv_len) bias for every head: the product adds it (and applies the scale) itself.
        scores = torch.baddbmm(bias.view(q_len, kv_len), q, k.transpose(1, 2), alpha=scale)  # (N, q_len, kv_len)
    else:
        scores = torch.bmm(q, k.transpose(1, 2))  # (N, q_len, d) @ (N, d, kv_len) -> (N, q_len, kv_len)
        if scale != 1.0:
            scores.mul_(scale)
        if bias is not None:  # a broadcast add: far cheaper on the CPU than masked_fill_
            logical(scores).add_(bias)
    scores.sub_(scores.amax(dim=-1, keepdim=True))  # every row holds a finite score (checked by the caller)
    probs = exp_flush_tiny_(scores)
    probs.div_(probs.sum(dim=-1, keepdim=True))  # P, (N, q_len, kv_len)
    return torch.bmm(probs, v), probs  # (N, q_len, kv_len) @ (N, kv_len, d_v) -> (N, q_len, d_v)


def attend_folded_backward(q, k, v, probs, out, grad_out, scale: float, into: torch.Tensor | None = None):
    """(dQ, dK, dV) of ``attend_folded`` from dO.   grad_out (N, q_len, d_v) -> (N, q_len, d), (N, kv_len, d), (N, kv_len, d_v)

    into: where the three may be written, (3, N, len, d) when Q, K and V have one shape.
    """
    grad_value = torch.bmm(probs.transpose(1, 2), grad_out, out=None if into is None else into[2])  # (N, kv_len, q_len) @ (N, q_len, d_v)
    grad_probs = torch.bmm(grad_out, v.transpose(1, 2))  # (N, q_len, d_v) @ (N, d_v, kv_len) -> (N, q_len, kv_len)
    rows = (grad_out * out).sum(dim=-1, keepdim=True)  # D, (N, q_len, 1)
    grad_scores = grad_probs.sub_(rows).mul_(probs)  # dS, (N, q_len, kv_len)
    grad_query = torch.bmm(grad_scores, k, out=None if into is None else into[0])  # (N, q_len, kv_len) @ (N, kv_len, d)
    grad_key = torch.bmm(grad_scores.transpose(1, 2), q, out=None if into is None else into[1])  # (N, kv_len, q_len) @ (N, q_len, d)
    if scale != 1.0:
        grad_query.mul_(scale)
        grad_key.mul_(scale)
    return grad_query, grad_key, grad_value


class _Fold(NamedTuple):
    """How (..., n, d) tensors fold to (N, n, d): their leading axes taken in ``order``."""

    order: tuple[int, ...]  # the leading axes, outermost in memory first
    stored: tuple[int, ...]  # their sizes in that order
    back: tuple[int, ...] | None  # the permutation that undoes ``order``; None when it is (0, 1, ...)

    @staticmethod
    def of(*tensors: torch.Tensor) -> _Fold:
        """The order the tensors are stored in, when they agree on it and each folds that way
        without a copy; else the logical order (then ``fold`` copies what is strided)."""
        first = tensors[0]
        lead = first.shape[:-2]
        order = tuple(range(len(lead)))
        if not first.is_contiguous():
            stored = tuple(sorted(order, key=lambda i: -first.stride(i)))
            if all(t.permute(*stored, -2, -1).is_contiguous() for t in tensors):
                order = stored
        if order == tuple(range(len(lead))):
            return _Fold(order, tuple(lead), None)
        return _Fold(order, tuple(lead[i] for i in order), tuple(sorted(range(len(order)), key=order.__getitem__)))

    def fold(self, t: torch.Tensor) -> torch.Tensor:
        """(..., n, d) -> (N, n, d), a view where the tensor is stored in this order."""
        if self.back is not None:
            t = t.permute(*self.order, -2, -1)
        return t.contiguous().view(-1, t.shape[-2], t.shape[-1])

    def unfold(self, t: torch.Tensor) -> torch.Tensor:
        """(N, n, d) -> (..., n, d): ``fold`` undone, a view."""
        stored = t.view(*self.stored, t.shape[-2], t.shape[-1])
        return stored if self.back is None else stored.permute(*self.back, -2, -1)


def _additive(attn_mask, is_causal: bool, q_len: int, kv_len: int, query: torch.Tensor) -> torch.Tensor | None:
    """The mask (and the causal rule, top-left) as one float tensor to add: 0 or -inf, at the mask's own size."""
    bias = None
    if attn_mask is not None:
        bias = attn_mask if attn_mask.dtype != torch.bool else (
            torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(~attn_mask, float("-inf")))
    if is_causal:
        causal = causal_bias(q_len, kv_len, query.dtype, query.device)
        bias = causal if bias is None else bias + causal
    return bias


@functools.lru_cache(maxsize=16)
def causal_bias(q_len: int, kv_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The causal rule (top-left) as 0 / -inf, (q_len, kv_len): built once per size, as every
    layer of every step asks for the same one; only read (added), never written."""
    allowed = causal_mask(q_len, kv_len, align="top_left", device=device)  # (q_len, kv_len)
    return torch.zeros(q_len, kv_len, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
