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

    Entry (i, j) is the dot product of query i with key j: how well they match. A
    single query vector (d,) against keys (kv_len, d) gives (kv_len,), the seed's
    ``inputs @ query``. Leading axes broadcast as in ``torch.matmul``.

    Args:
        query: the queries, (..., q_len, d), or one query vector (d,).
        keys: the keys, (..., kv_len, d), with the same d as ``query``.
        scale: multiplies every score; applied to the queries, before the product. The
            seed uses 1 (the default); scaled attention uses 1/sqrt(d).
        out: a tensor of the result's shape to write into, as the fast path does to
            reuse memory. Ignored for a 1-D ``query``. None: a new tensor.

    Returns:
        omega, (..., q_len, kv_len), or (kv_len,) for a 1-D ``query``.

    Raises:
        ShapeError: ``query`` and ``keys`` differ in their last dimension.

    Examples:
        >>> import selfattn as sa
        >>> x = sa.seed_embeddings(sa.tokenize(sa.SEED_SENTENCE))
        >>> sa.attention_scores(x[1], x).round(decimals=4)  # "cat" against every token
        tensor([0.6682, 1.3581, 1.2746, 0.7640, 0.6660, 1.0855, 1.3341])
        >>> sa.attention_scores(x, x).shape
        torch.Size([7, 7])
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

    The seed's for-loop form, kept to show that the matrix product in
    ``attention_scores`` computes the same numbers. Unscaled.

    Args:
        query: one query vector x_q, (d,).
        keys: the keys x_j, (kv_len, d).

    Returns:
        omega, (kv_len,).

    Raises:
        ShapeError: ``query`` is not 1-D, ``keys`` is not 2-D, or their d differ.
    """
    if query.dim() != 1 or keys.dim() != 2 or query.shape[0] != keys.shape[1]:
        raise ShapeError(
            f"the loop form takes one query vector (d,) and keys (kv_len, d): "
            f"query {tuple(query.shape)}, keys {tuple(keys.shape)}"
        )
    return torch.stack([torch.dot(key, query) for key in keys])


class SoftmaxParts(NamedTuple):
    """The intermediates of one softmax: weights = exp / total, exp = exp(scores - shift).

    Shapes below are for a softmax along the last axis; along another ``dim``, that axis
    has size 1 in ``shift`` and ``total``.

    Attributes:
        shift: (..., 1), m: the row max in the stable form (0 where that max is not
            finite, as in a row of all -inf, or where the row is empty); 0 in the naive form.
        shifted: (..., n), omega - m.
        exp: (..., n), exp(omega - m).
        total: (..., 1), the row sums of ``exp``; in the stable form 1 where the sum is 0.
        weights: (..., n), alpha = exp / total.
    """

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
    and an empty row (no keys) gives an empty one. A +inf score still gives NaN.
    Naive form: exp overflows once a score exceeds about 88.7 in float32 and inf / inf
    is NaN; an all -inf row is 0 / 0, NaN too. It is kept to show why the stable form
    exists. m carries no gradient: it cancels out of alpha.

    Args:
        scores: omega, (..., n), any float dtype.
        dim: the axis to normalise over (default -1, the keys).
        stable: True (default) for the stable form, False for the naive one (m = 0).

    Returns:
        A ``SoftmaxParts`` (shift, shifted, exp, total, weights); ``weights`` has the
        shape of ``scores`` and sums to 1 along ``dim`` (in the stable form, 0 for a
        row of all -inf).

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> parts = sa.softmax_parts(torch.tensor([1.0, 2.0, 3.0]))
        >>> parts.shift, parts.shifted
        (tensor([3.]), tensor([-2., -1.,  0.]))
        >>> parts.total.round(decimals=4), parts.weights.round(decimals=4)
        (tensor([1.5032]), tensor([0.0900, 0.2447, 0.6652]))
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
    """alpha = exp(omega) / sum exp(omega), literally.   (..., n) -> (..., n)

    Overflows once a score exceeds about 88.7 in float32: the row then holds NaN. Kept
    to compare with ``softmax_stable``.

    Args:
        scores: omega, (..., n).
        dim: the axis to normalise over (default -1).

    Returns:
        alpha, the shape of ``scores``; NaN in rows that overflow or are all -inf.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> sa.softmax_naive(torch.tensor([1000.0, 0.0]))
        tensor([nan, 0.])
    """
    return softmax_parts(scores, dim, stable=False).weights


def softmax_stable(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """alpha = exp(omega - max omega) / sum exp(omega - max omega).   (..., n) -> (..., n)

    Args:
        scores: omega, (..., n).
        dim: the axis to normalise over (default -1).

    Returns:
        alpha, the shape of ``scores``, summing to 1 along ``dim``; zeros for a row of
        all -inf.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> sa.softmax_stable(torch.tensor([1000.0, 0.0]))
        tensor([1., 0.])
    """
    return softmax_parts(scores, dim, stable=True).weights


def plain_division(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """w_j = omega_j / sum_k omega_k: the scores divided by their sum, no exponential.   (..., n) -> (..., n)

    The obvious way to make scores add up to 1, kept to show why attention uses softmax
    instead. It only gives weights when every score is positive: a negative score gets
    a negative weight, a sum of 0 divides by zero (inf, -inf, or NaN for a zero score),
    and a negative sum flips every sign, so the largest score gets the smallest weight.

    Args:
        scores: omega, (..., n).
        dim: the axis to divide along (default -1, the keys).

    Returns:
        w, the shape of ``scores``; it sums to 1 along ``dim`` wherever the sum of the
        scores is not 0, and holds inf, -inf or NaN where it is.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> sa.plain_division(torch.tensor([1.0, 3.0]))
        tensor([0.2500, 0.7500])
        >>> sa.plain_division(torch.tensor([2.0, -1.0]))  # a negative weight
        tensor([ 2., -1.])
        >>> sa.plain_division(torch.tensor([1.0, -1.0, 0.0]))  # the sum is 0
        tensor([inf, -inf, nan])
    """
    return scores / scores.sum(dim=dim, keepdim=True)  # (..., n) / (..., 1)


def softmax(scores: torch.Tensor, dim: int = -1, stable: bool = True) -> torch.Tensor:
    """alpha = softmax(omega) along ``dim``: the stable form unless ``stable=False``.   (..., n) -> (..., n)

    Turns scores into weights that are positive and sum to 1 along ``dim``. See
    ``softmax_parts`` for the intermediates and the edge cases.

    Args:
        scores: omega, (..., n).
        dim: the axis to normalise over (default -1, the keys).
        stable: True (default) subtracts the row max first (``softmax_stable``); False
            computes exp(omega) as it is (``softmax_naive``).

    Returns:
        alpha, the shape of ``scores``.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> sa.softmax(torch.tensor([1.0, 2.0, 3.0])).round(decimals=4)
        tensor([0.0900, 0.2447, 0.6652])
        >>> sa.softmax(torch.tensor([float("-inf"), float("-inf")]))  # every key masked
        tensor([0., 0.])
    """
    return softmax_stable(scores, dim) if stable else softmax_naive(scores, dim)


def context_vectors(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """z = alpha V.   (..., q_len, kv_len), (..., kv_len, d) -> (..., q_len, d)

    Each query's context vector is the weighted average of the value rows. One weight
    row (kv_len,) gives one context vector (d,): z = sum_j alpha_j x_j. Leading axes
    broadcast as in ``torch.matmul``.

    Args:
        weights: alpha, (..., q_len, kv_len), or one row (kv_len,).
        values: V, (..., kv_len, d); X itself in the seed.

    Returns:
        z, (..., q_len, d), or (d,) for one weight row.

    Raises:
        ShapeError: ``weights`` has not one column per row of ``values``.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> sa.context_vectors(torch.tensor([0.25, 0.75]), torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        tensor([0.2500, 1.5000])
    """
    if values.dim() < 2 or weights.shape[-1] != values.shape[-2]:
        raise ShapeError(
            f"weights must have one column per value row: weights {tuple(weights.shape)}, "
            f"values {tuple(values.shape)}"
        )
    return weights @ values  # (..., q_len, kv_len) @ (..., kv_len, d) -> (..., q_len, d)


def context_vector_loop(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """z = sum_j alpha_j x_j, one term at a time.   (kv_len,), (kv_len, d) -> (d,)

    The seed's running-sum form, kept to show that ``context_vectors`` computes the same.

    Args:
        weights: one row of attention weights alpha, (kv_len,).
        values: the vectors x_j, (kv_len, d).

    Returns:
        z, (d,), in the dtype of ``values``.

    Raises:
        ShapeError: ``weights`` is not 1-D, ``values`` is not 2-D, or their kv_len differ.
    """
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
    """Z = softmax(X X^T) X: the seed's three lines.   (..., n, d) -> (..., n, d)

    Every token is query, key and value at once: unscaled scores, the stable softmax
    over each row, then the weighted sum of the rows of X. No projections, no mask.

    Args:
        x: the embeddings X, (..., n, d).

    Returns:
        Z, (..., n, d): row i is the context vector of token i.

    Raises:
        ShapeError: ``x`` is a single vector, not (..., n, d).

    Examples:
        >>> import selfattn as sa
        >>> x = sa.seed_embeddings(sa.tokenize(sa.SEED_SENTENCE))
        >>> z = sa.self_attention(x)
        >>> z.shape
        torch.Size([7, 3])
        >>> z[1].round(decimals=4)  # the context vector of "cat"
        tensor([0.4964, 0.6149, 0.5813])
    """
    if x.dim() < 2:
        raise ShapeError(f"X must be (..., n, d), one row per token, got shape {tuple(x.shape)}")
    scores = attention_scores(x, x)  # (..., n, n)
    weights = softmax(scores)  # (..., n, n), rows sum to 1
    return context_vectors(weights, x)  # (..., n, d)
