"""Steps 3 to 6 of the seed: scores, softmax, context vectors, and all three at once.

Each function is pure, mirrors one equation, and accepts leading batch/head axes.
Notation (1-based in the maths, 0-based in the code):

    omega_ij = x_i . x_j                  attention score of query i for key j
    alpha_ij = exp(omega_ij) / sum_k exp(omega_ik)      attention weight (softmax)
    z_i      = sum_j alpha_ij x_j         context vector of query i
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from selfattn.errors import ShapeError


def attention_scores(
    query: torch.Tensor, keys: torch.Tensor, scale: float = 1.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """omega = scale * q K^T.   (..., q_len, d), (..., kv_len, d) -> (..., q_len, kv_len)

    A single query vector (d,) against keys (kv_len, d) gives (kv_len,): the seed's
    ``inputs @ query``. The seed uses scale = 1; scaled attention uses 1/sqrt(d).
    out: a tensor of the result's shape to write into (the fast path reuses one).
    """
    if query.shape[-1] != keys.shape[-1]:
        raise ShapeError(
            f"query and keys must have the same last dimension: query {tuple(query.shape)}, "
            f"keys {tuple(keys.shape)}"
        )
    if scale != 1.0:
        query = query * scale  # scaling the q_len x d queries is cheaper than the q_len x kv_len scores
    if query.dim() == 1:
        return keys @ query  # (kv_len, d) @ (d,) -> (kv_len,)
    if out is not None:
        return torch.matmul(query, keys.transpose(-2, -1), out=out)
    return query @ keys.transpose(-2, -1)  # (..., q_len, d) @ (..., d, kv_len) -> (..., q_len, kv_len)


def attention_scores_loop(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """omega_j = x_q . x_j, one dot product at a time.   (d,), (kv_len, d) -> (kv_len,)

    The seed's for-loop form, kept to show that the matrix product computes the same thing.
    """
    if query.dim() != 1 or keys.dim() != 2 or query.shape[0] != keys.shape[1]:
        raise ShapeError(
            f"the loop form takes one query vector (d,) and keys (kv_len, d): "
            f"query {tuple(query.shape)}, keys {tuple(keys.shape)}"
        )
    return torch.stack([torch.dot(key, query) for key in keys])


class SoftmaxParts(NamedTuple):
    """The intermediates of one softmax: weights = exp / total, exp = exp(scores - shift)."""

    shift: torch.Tensor  # (..., 1): the row max (stable form) or 0 (naive form)
    shifted: torch.Tensor  # (..., n): scores - shift
    exp: torch.Tensor  # (..., n)
    total: torch.Tensor  # (..., 1)
    weights: torch.Tensor  # (..., n)


def softmax_parts(scores: torch.Tensor, dim: int = -1, stable: bool = True) -> SoftmaxParts:
    """alpha = exp(omega - m) / sum exp(omega - m), with every intermediate.   (..., n) -> (..., n)

    Stable form: m = max omega. Equal to the naive form (m = 0) in exact arithmetic,
    since the factor exp(-m) cancels, but the largest exponent is exp(0) = 1, so nothing
    overflows. A row whose scores are all -inf (every key masked) gives zeros, not NaN,
    and an empty row (no keys) gives an empty one.
    Naive form: exp overflows once a score exceeds about 88.7 in float32 and inf / inf
    is NaN; it is kept to show why the stable form exists.
    """
    if stable and scores.shape[dim]:
        # The shift cancels out of the result, so it needs no gradient of its own.
        shift = scores.amax(dim=dim, keepdim=True).detach()
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    else:
        # No shift; also for an empty row (no keys at all), which has no max.
        shift = torch.zeros_like(scores.sum(dim=dim, keepdim=True))
    shifted = scores - shift
    exp = torch.exp(shifted)
    total = exp.sum(dim=dim, keepdim=True)
    if stable:
        # total is 0 only when every score is -inf; 0 / 1 then gives the zero row.
        total = torch.where(total == 0, torch.ones_like(total), total)
    return SoftmaxParts(shift, shifted, exp, total, exp / total)


def softmax_numerators(scores: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """(e, l) with e = exp(omega - m) and l = max(sum e, 1), overwriting ``scores`` with e.   (..., n) -> (..., n), (..., 1)

    alpha = e / l. The stable softmax split in two, so that a caller can divide later
    (after multiplying by V). m = max omega, so the largest e is exp(0) = 1 and l >= 1
    for any row with a finite score; a row of all -inf has m clamped to the lowest
    finite number, e = 0 and l = 1, so alpha = 0 there instead of 0 / 0.
    In place: only for tensors that no gradient flows through.
    """
    shift = scores.amax(dim=dim, keepdim=True).clamp_(min=torch.finfo(scores.dtype).min)  # (..., 1)
    exp = scores.sub_(shift).exp_()
    return exp, exp.sum(dim=dim, keepdim=True).clamp_(min=1.0)


def softmax_numerators_unshifted(scores: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """(e, l) with e = exp(omega) and l = sum e, overwriting ``scores`` with e.   (..., n) -> (..., n), (..., 1)

    alpha = e / l, as in ``softmax_numerators`` but with no shift: the caller must know
    that every finite score is small enough in size that exp neither overflows nor
    underflows to zero (see ``attention.functional.exp_is_safe``). It saves two passes
    over the scores. A row of all -inf gives l = 0, kept at the smallest positive
    number so that alpha = 0 there.
    """
    exp = scores.exp_()
    return exp, exp.sum(dim=dim, keepdim=True).clamp_(min=torch.finfo(scores.dtype).tiny)


def softmax_rows(scores: torch.Tensor, dim: int = -1, in_place: bool = False) -> torch.Tensor:
    """alpha = exp(omega - m) / sum exp(omega - m), without keeping the intermediates.   (..., n) -> (..., n)

    The same stable softmax as ``softmax_parts``, for the fast path. in_place=True
    overwrites ``scores`` with the weights: on CPU most of an elementwise pass over a
    large score matrix is spent allocating and first touching fresh memory, so three
    passes in place cost about what one fused softmax does. Only for tensors that no
    gradient flows through (``exp_`` would overwrite what backward needs).
    A row of all -inf gives zeros; an empty row stays empty.
    """
    if not scores.shape[dim]:
        return scores if in_place else scores.clone()
    if in_place:
        exp, total = softmax_numerators(scores, dim)
        return exp.div_(total)
    shift = scores.amax(dim=dim, keepdim=True).detach()  # (..., 1)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    exp = torch.exp(scores - shift)
    total = exp.sum(dim=dim, keepdim=True)  # (..., 1)
    return exp / torch.where(total == 0, torch.ones_like(total), total)


def softmax_naive(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """alpha = exp(omega) / sum exp(omega), literally.   (..., n) -> (..., n)"""
    return softmax_parts(scores, dim, stable=False).weights


def softmax_stable(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """alpha = exp(omega - max omega) / sum exp(omega - max omega).   (..., n) -> (..., n)"""
    return softmax_parts(scores, dim, stable=True).weights


def softmax(scores: torch.Tensor, dim: int = -1, stable: bool = True) -> torch.Tensor:
    """alpha = softmax(omega) along ``dim``: the stable form unless ``stable=False``.   (..., n) -> (..., n)"""
    return softmax_stable(scores, dim) if stable else softmax_naive(scores, dim)


def context_vectors(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """z = alpha V.   (..., q_len, kv_len), (..., kv_len, d) -> (..., q_len, d)

    One weight row (kv_len,) gives one context vector (d,): z = sum_j alpha_j x_j.
    """
    if weights.shape[-1] != values.shape[-2]:
        raise ShapeError(
            f"weights must have one column per value row: weights {tuple(weights.shape)}, "
            f"values {tuple(values.shape)}"
        )
    return weights @ values  # (..., q_len, kv_len) @ (..., kv_len, d) -> (..., q_len, d)


def context_vector_loop(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """z = sum_j alpha_j x_j, one term at a time.   (kv_len,), (kv_len, d) -> (d,)"""
    if weights.dim() != 1 or values.dim() != 2 or weights.shape[0] != values.shape[0]:
        raise ShapeError(
            f"the loop form takes one weight row (kv_len,) and values (kv_len, d): "
            f"weights {tuple(weights.shape)}, values {tuple(values.shape)}"
        )
    total = torch.zeros(values.shape[1], dtype=values.dtype, device=values.device)
    for weight, value in zip(weights, values):
        total = total + weight * value
    return total


def self_attention(x: torch.Tensor) -> torch.Tensor:
    """Z = softmax(X X^T) X: the seed's three lines.   (..., n, d) -> (..., n, d)"""
    scores = attention_scores(x, x)  # (..., n, n)
    weights = softmax(scores)  # (..., n, n), rows sum to 1
    return context_vectors(weights, x)  # (..., n, d)
