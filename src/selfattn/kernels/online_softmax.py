"""The online softmax: softmax(s) V over key blocks, one block at a time, exactly.

Split the keys of a query row into blocks. After the blocks seen so far, keep three
numbers per row (two scalars and one vector):

    m    the largest score so far
    l    sum_j exp(s_j - m) over the keys so far
    acc  sum_j exp(s_j - m) v_j over the keys so far

A new block with scores s_B and values V_B updates them:

    m'   = max(m, max s_B)
    r    = exp(m - m')                          the old terms were relative to m: rescale them
    l'   = r l + sum_j exp(s_Bj - m')
    acc' = r acc + exp(s_B - m') V_B

At the end, softmax(s) V = acc / l and the log-sum-exp of the row is m + log l. Nothing
is approximated: r turns every earlier term exp(s_j - m) into exp(s_j - m') exactly,
so the result is the plain softmax's, only summed in another order. This is the heart of
FlashAttention (Dao et al., 2022; Milakov and Gimelshein, 2018 for the softmax alone).

Rows whose keys are all masked so far have m = -inf; the shift then uses 0 instead, so
no -inf - (-inf) appears, their l stays 0, and they finish as a zero output with lse = -inf.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

NEG_INF = float("-inf")


class OnlineSoftmaxState(NamedTuple):
    """The running numbers of every query row of a block.   m, l: (..., rows, 1); acc: (..., rows, d_v)

    Attributes:
        m: (..., rows, 1) the largest score seen so far in each row (-inf before any
            visible key; 0 throughout in ``online_sum_update``, which keeps no max).
        l: (..., rows, 1) sum_j exp(s_j - m) over the keys seen so far.
        acc: (..., rows, d_v) sum_j exp(s_j - m) v_j over the keys seen so far.
    """

    m: torch.Tensor
    l: torch.Tensor  # noqa: E741 - the papers' name
    acc: torch.Tensor


class BlockUpdate(NamedTuple):
    """What one key block did, for the step-by-step explanation.

    Attributes:
        block_max: (..., rows, 1) max s_B, the largest score of the block in each row.
        rescale: (..., rows, 1) r = exp(m - m'), the factor on the earlier l and acc.
        exp: (..., rows, block) exp(s_B - m'): the scores tensor given to
            ``online_softmax_update``, overwritten.
        state: the ``OnlineSoftmaxState`` after the block.
    """

    block_max: torch.Tensor  # (..., rows, 1): max s_B
    rescale: torch.Tensor  # (..., rows, 1): r = exp(m - m')
    exp: torch.Tensor  # (..., rows, block): exp(s_B - m')
    state: OnlineSoftmaxState  # after the block


def online_softmax_start(rows_shape: tuple[int, ...], d_v: int, like: torch.Tensor) -> OnlineSoftmaxState:
    """m = -inf, l = 0, acc = 0 for rows of shape (..., rows).   -> state

    Args:
        rows_shape: the leading axes and the row count, (..., rows).
        d_v: the size of a value vector.
        like: a tensor whose dtype and device the state takes.

    Returns:
        The ``OnlineSoftmaxState`` before any key: m (..., rows, 1) of -inf, l (..., rows, 1)
            and acc (..., rows, d_v) of zeros.
    """
    m = torch.full((*rows_shape, 1), NEG_INF, dtype=like.dtype, device=like.device)
    l = torch.zeros((*rows_shape, 1), dtype=like.dtype, device=like.device)  # noqa: E741
    acc = torch.zeros((*rows_shape, d_v), dtype=like.dtype, device=like.device)
    return OnlineSoftmaxState(m, l, acc)


def online_softmax_update(state: OnlineSoftmaxState, scores: torch.Tensor, values: torch.Tensor, drop=None) -> BlockUpdate:
    """Fold one key block into the state.   scores (..., rows, block) (overwritten), values (..., block, d_v)

    m' = max(m, max s_B), r = exp(m - m'), l' = r l + sum_j exp(s_Bj - m'),
    acc' = r acc + exp(s_B - m') V_B. ``scores`` becomes exp(s_B - m') in place: the caller
    hands over a fresh score block and need not keep it. Masked keys carry -inf and
    contribute exp(-inf) = 0. A row with no visible key so far is shifted by 0 instead of
    -inf, so it stays at l = 0 without a NaN. On the CPU exp results too small to matter
    are flushed to 0 (``exp_flush_tiny_``).

    Args:
        state: the running numbers after the earlier blocks (``online_softmax_start`` for
            the first).
        scores: (..., rows, block) this block's scores s_B, -inf where masked; overwritten.
        values: (..., block, d_v) this block's values V_B.
        drop: None, or a function that applies dropout to exp(s_B - m') in place after
            its row sums are taken (``kernels.tile_dropout``): l keeps the full softmax's
            denominator, only acc sees the dropped weights.

    Returns:
        A ``BlockUpdate``: the block's max, the rescale factor r, exp(s_B - m') (the
            ``scores`` tensor) and the new state.
    """
    block_max = scores.amax(dim=-1, keepdim=True)  # (..., rows, 1)
    m_new = torch.maximum(state.m, block_max)
    shift = m_new.masked_fill(m_new == NEG_INF, 0.0)  # rows with no visible key yet: any finite shift works
    exp = exp_flush_tiny_(scores.sub_(shift))  # (..., rows, block)
    rescale = torch.exp(state.m - shift)  # exp(-inf) = 0 the first time
    l_new = torch.addcmul(exp.sum(dim=-1, keepdim=True), rescale, state.l)  # r l + sum exp
    if drop is not None:
        exp = drop(exp)
    acc_new = torch.addcmul(exp @ values, rescale, state.acc)  # r acc + exp V_B: (..., rows, d_v)
    return BlockUpdate(block_max, rescale, exp, OnlineSoftmaxState(m_new, l_new, acc_new))


def exp_flush_tiny_(x: torch.Tensor, cap: float | None = None, flush: bool = True) -> torch.Tensor:
    """exp(x) in place, where x <= 0 is a score minus the row's max or lse; on the CPU every
    result too small to matter becomes exactly 0.   -> x

    Why: on the CPU torch's exp takes a slow path for inputs below about -87 (float32), whose
    results are subnormal or zero, and arithmetic on subnormal numbers is slow too. Measured
    here: exp of such inputs 80-200x slower than of ordinary ones (exp(-inf) 20x), a matmul
    with subnormal entries about 180x. A peaked softmax (large logits, as trained models
    have) puts such inputs in every tile, and a masked key is -inf. So the inputs are first
    clamped to ``exp_floor`` (its exp is still a normal number), and then everything below
    e * exp(floor) is set to 0. What is dropped weighs less than 1e-34 (float32) against the
    row's largest term, about 1: below float32's resolution. Elsewhere (CUDA; float16, whose
    floor would be far too high) a plain exp.

    Args:
        x: the exponents (a score minus the row's max or lse); overwritten with the result.
        cap: None, or an upper clamp applied before exp (the backward's hidden keys, whose
            S - lse may be large).
        flush: False gives a plain exp (with the cap), for a caller that has proved
            nothing underflows.

    Returns:
        ``x`` itself, now exp(x), with results below e * exp(floor) set to exactly 0 where a
            floor applies.
    """
    floor = exp_floor(x) if flush else None
    if floor is None:
        return (x if cap is None else x.clamp_max_(cap)).exp_()
    x.clamp_(min=floor, max=cap).exp_()
    return torch.nn.functional.threshold_(x, math.exp(floor + 1.0), 0.0)  # exp(floor) itself is below the cut


def exp_floor(x: torch.Tensor) -> float | None:
    """The lowest input ``exp_flush_tiny_`` passes to exp: 8 above the log of the dtype's smallest
    normal number (float32 -79.3, float64 -700.4), so that exp of it times a value as small as
    1e-3 stays normal. None where no flushing is done (not CPU, or a floor above -60: float16).

    Args:
        x: the tensor to be exponentiated; only its device and dtype are read.

    Returns:
        log(smallest normal number of x's dtype) + 8, or None off the CPU, for a
            non-floating dtype, or where that is above -60 (float16).
    """
    return _floor_for(x.device.type, x.dtype)


@functools.lru_cache(maxsize=None)
def _floor_for(device_type: str, dtype: torch.dtype) -> float | None:
    if device_type != "cpu" or not dtype.is_floating_point:
        return None
    floor = math.log(torch.finfo(dtype).tiny) + 8.0
    return floor if floor < -60.0 else None


def online_sum_update(state: OnlineSoftmaxState, weights: torch.Tensor, values: torch.Tensor,
                      drop=None) -> OnlineSoftmaxState:
    """The same fold with m held at 0: l' = l + sum w, acc' = acc + w V_B, where w = exp(s_B).   weights (..., rows, block)

    The caller takes the exp (and zeroes masked keys). Exact when no exp(s) can overflow
    or underflow to zero, which the caller must have proved (``flash_tiles.exp_is_bounded``):
    the softmax does not depend on the shift, and without a running max there is nothing
    to rescale, so a block costs two fewer passes over its scores and no small rescaling
    steps. Rows with no visible key keep l = 0.

    Args:
        state: the running sums, with m all 0; its l and acc are updated in place.
        weights: (..., rows, block) w = exp(s_B), 0 for masked keys.
        values: (..., block, d_v) this block's values V_B.
        drop: None, or dropout applied to the weights in place after their sums (as in
            ``online_softmax_update``).

    Returns:
        The state with the new l and acc (the same tensors, updated in place) and m unchanged.
    """
    state.l.add_(weights.sum(dim=-1, keepdim=True))
    if drop is not None:
        weights = drop(weights)
    return OnlineSoftmaxState(state.m, state.l, state.acc.add_(weights @ values))


def online_softmax_finish(state: OnlineSoftmaxState) -> tuple[torch.Tensor, torch.Tensor]:
    """(acc / l, m + log l).   -> output (..., rows, d_v), lse (..., rows)

    A row that saw no key (l = 0) gives a zero output and lse = -inf.

    Args:
        state: the running numbers after the last key block.

    Returns:
        The pair (output, lse), output (..., rows, d_v) = acc / l, the softmax-weighted
            average of the values, and lse (..., rows) = m + log l, the natural log of the
            row's softmax denominator.

    Examples:
        >>> import torch
        >>> from selfattn.kernels import online_softmax as online
        >>> g = torch.Generator().manual_seed(0)
        >>> s = torch.randn(2, 6, generator=g, dtype=torch.float64)  # scores of 2 query rows over 6 keys
        >>> v = torch.randn(6, 3, generator=g, dtype=torch.float64)  # their values
        >>> state = online.online_softmax_start((2,), 3, s)
        >>> for block in (slice(0, 4), slice(4, 6)):  # keys 0-3, then keys 4-5
        ...     state = online.online_softmax_update(state, s[:, block].clone(), v[block]).state
        >>> out, lse = online.online_softmax_finish(state)
        >>> torch.allclose(out, torch.softmax(s, dim=-1) @ v), torch.allclose(lse, torch.logsumexp(s, dim=-1))
        (True, True)
    """
    seen = state.l > 0
    output = state.acc / torch.where(seen, state.l, torch.ones_like(state.l))
    lse = torch.where(seen, state.m + torch.log(state.l), torch.full_like(state.l, NEG_INF))
    return output, lse[..., 0]


def merge_partial_attention(
    output: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys A and keys B from the results over each.   (..., rows, d_v), (..., rows) twice

        lse  = log(exp(lse_A) + exp(lse_B))
        O    = exp(lse_A - lse) O_A + exp(lse_B - lse) O_B

    Each O is a softmax average over its own keys; exp(lse_X - lse) is the share of the
    row's total weight that lies in X, so the mix is the softmax over A and B together,
    exactly. In place: ``output`` becomes the merged O (returned with the merged lse) and
    ``part`` is overwritten, so merging costs no memory. Computed in the inputs' dtype:
    call it with float32 or float64. A row that sees no key on one side (lse = -inf)
    takes the other side unchanged; on both sides it stays 0 with lse = -inf, never NaN.

    Args:
        output: (..., rows, d_v) O_A, attention over keys A; overwritten with the merged O.
        lse: (..., rows) lse_A, the log-sum-exp of the rows over keys A.
        part: (..., rows, d_v) O_B, attention over keys B (disjoint from A); overwritten.
        part_lse: (..., rows) lse_B.

    Returns:
        The pair (O, lse): ``output`` itself, now the attention over A and B together
            (..., rows, d_v), and the merged log-sum-exp (..., rows), a new tensor.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> from selfattn.kernels.online_softmax import merge_partial_attention
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 5, 4, generator=g, dtype=torch.float64).unbind(0)
        >>> o_a, lse_a = sa.flash_attention(q, k[..., :2, :], v[..., :2, :], return_lse=True)  # keys 0-1
        >>> o_b, lse_b = sa.flash_attention(q, k[..., 2:, :], v[..., 2:, :], return_lse=True)  # keys 2-4
        >>> out, lse = merge_partial_attention(o_a, lse_a, o_b, lse_b)
        >>> torch.allclose(out, sa.scaled_dot_product_attention(q, k, v))
        True
    """
    merged = torch.logaddexp(lse, part_lse)  # (..., rows); -inf only where both are -inf
    shift = merged.masked_fill(merged == NEG_INF, 0.0)[..., None]  # (..., rows, 1): exp(-inf - 0) = 0, not NaN
    output.mul_(torch.exp(lse[..., None] - shift)).add_(part.mul_(torch.exp(part_lse[..., None] - shift)))
    return output, merged
