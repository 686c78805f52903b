"""FlashAttention-2's backward over the tiles a mask leaves: dQ, dK, dV from the forward's lse.

The forward's loops and tile helpers are in ``flash_tiles``; this pass recomputes every
tile's probabilities P = exp(S - lse) instead of storing them, in row blocks of at most
``kernels.flash.BACKWARD_BLOCK_Q`` rows, and sums dK and dV over SUM_ROWS rows at a time.
"""

from __future__ import annotations

import math
import threading

import torch

from selfattn.kernels.flash_tiles import (
    TileBuffer,
    block_spans,
    log_tile,
    logging_tiles,
    group_rows,
    query_factor,
    score_bound,
    ungroup_rows,
    visible_tiles,
)
from selfattn.kernels.workers import run_units
from selfattn.kernels.online_softmax import NEG_INF, exp_floor, exp_flush_tiny_
from selfattn.masks.states import mask_slice


def backward_may_underflow(q: torch.Tensor, k: torch.Tensor, scale: float, mask, lse: torch.Tensor,
                           softcap: float = 0.0) -> bool:
    """Whether some S - lse of the backward can fall below ``exp_floor``, so that P = exp(S - lse)
    needs ``exp_flush_tiny_``: S >= -B (``score_bound``) and lse <= max lse, so S - lse >= -B - max lse.
    A row that sees no key (lse = -inf) is computed with lse = +inf: always."""
    floor = exp_floor(lse)
    if floor is None or not q.numel() or not k.numel() or not lse.numel():
        return False
    if not bool(torch.isfinite(lse).all()):
        return True
    return score_bound(q, k, scale, mask, softcap) + float(lse.amax()) > -floor


def flash_backward(grad_out, q, k, v, output, lse, mask, scale, block_q, block_k, group: int = 1, mask_grad=None,
                   grads=None, score_mod=None, dropout=None, softcap: float = 0.0, lse_low=None):
    """FlashAttention-2's backward: dQ, dK, dV tile by tile, from lse; adds dS into ``mask_grad`` (a float mask's gradient).

    score_mod: as in ``flash_forward``, with ``score_mod.backward(ds, ...)`` (``kernels.flex``):
    each tile's scores go through it again under autograd, and dS is carried back through it
    to the raw scores (and into the tensors it captures) before dQ and dK.
    dropout: the forward's ``TileDropout``: its pattern is drawn again per tile, so that
    dV_j += (P Z / (1 - p))^T dO_i and dP = (dO_i V_j^T) Z / (1 - p) (``kernels.tile_dropout``).
    softcap: the forward's c: with t = tanh(scale Q K^T / c), S = c t and dS_raw = dS (1 - t^2).

    lse_low: the forward's ``lse_remainder`` (None: none). P = exp(S - lse) exp(-low), and
    exp(-low) is one number per row: it multiplies dO's rows (a row block at a time) and D,
    and so reaches dV, dP and dS without touching a tile. Without it P loses lse's
    rounding, an ulp of |S|.

    grads: (dQ, dK, dV) tensors shaped like q, k, v to add into (a ring accumulates its
    steps this way without temporaries); by default fresh zeros. Returns them.
    Per tile, every batch element and head in one batched product:

        P = exp((scale Q_i) K_j^T - lse_i)      dV_j += P^T dO_i     (-lse added inside the product)
        dS = P * (dO_i V_j^T - D_i)             dQ_i += scale dS K_j
        dK_j += scale dS^T Q_i

    dQ_i, dK_j and dV_j are summed inside their products (``baddbmm_``, beta = 1) into
    contiguous per-block tensors: into a slice of dK, strided across the batch, torch copies
    instead (no faster than a product and an add). dK_j and dV_j go into dK and dV once per
    key block; measured 8-12% off the backward at N = 4096 (``bench/kernel_ab.py``). This loop
    runs about 12 torch calls per tile, and on small tiles their fixed cost is much of the time.
    """
    q_len, kv_len = q.shape[-2], k.shape[-2]
    # P = exp(S - lse) r with r = exp(-low) per row: folded into dO's rows (dV, dP and D are linear in it),
    # a row block at a time in the loop below, so that no scaled copy of dO is held.
    row_factor = None if lse_low is None else torch.exp(-lse_low)[..., None]  # (..., Hq, q_len, 1)
    flush = score_mod is not None or backward_may_underflow(q, k, scale, mask, lse, softcap)  # else a plain exp: two passes fewer
    if grads is None:
        grads = tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dq, dk, dv = grads
    if not q.numel() or not k.numel():  # no query or no key: nothing to add (and no (B Hk, ...) view of nothing)
        return dq, dk, dv
    lead = k.shape[:-2]  # (..., Hk): one batched product per tile covers every batch element and head
    k3, v3 = k.reshape(-1, *k.shape[-2:]), v.reshape(-1, *v.shape[-2:])  # (B Hk, kv_len, d), views unless broadcast
    dk3, dv3 = _accumulator(dk, q.dtype), _accumulator(dv, q.dtype)
    delta = (grad_out * output).sum(dim=-1, keepdim=True)  # D = rowsum(dO * O): (..., Hq, q_len, 1)
    if row_factor is not None:
        delta = delta * row_factor
    # exp(S - lse) with lse = +inf for rows that see nothing: their P is 0, not exp(-inf + inf).
    lse_safe = torch.where(lse == NEG_INF, torch.full_like(lse, float("inf")), lse)[..., None]  # (..., Hq, q_len, 1)
    # The scores are recomputed exactly as the forward made them, from q times scale (scale / c
    # with a softcap) and then the product: the same roundings, so that exp(S - lse) is the
    # forward's own softmax. Scaled after the product instead, S differs from the forward's by
    # a few ulps of |S|, and with large scores (softcap tests scale q by c) P, and every
    # gradient with it, lost up to 6x PyTorch's float32 accuracy. Scaled per tile (a few hundred
    # kilobytes), not as one copy of q: at 16k tokens the two copies held 64 MB more than SDPA.
    factor = query_factor(scale, softcap)
    exact_alpha = score_mod is None and not softcap and factor > 0 and math.frexp(factor)[0] == 0.5
    per_row = (q, grad_out, -lse_safe, delta) + (() if row_factor is None else (row_factor,))  # sliced per row block below
    rows_of, row_data = _row_blocks(per_row, grad_out, mask, q_len, kv_len, block_q, block_k, group)
    heads_view = lambda t, r: ungroup_rows(t.view(*lead, *t.shape[-2:]), group)  # noqa: E731 - (..., Hq, bq, bk) for masks
    local = threading.local()  # per thread: its tile buffers and its own dQ_i sums (key blocks run on several threads)
    all_dq = []  # every thread's dQ_i sums, added into dQ at the end

    def key_block(unit) -> None:
        (c0, c1), row_blocks = unit
        if not hasattr(local, "buffers"):
            local.buffers, local.dq = tuple(TileBuffer() for _ in range(8)), {}
            all_dq.append(local.dq)
        probs_buffer, dp_buffer, kept_buffer, tanh_buffer, dk_sum, dv_sum, qs_buffer, do_buffer = local.buffers
        k_j, v_j = k3[:, c0:c1], v3[:, c0:c1]  # (B Hk, bk, d)
        dk_j, dv_j = dk_sum.get(k_j.shape, k_j).zero_(), dv_sum.get(v_j.shape, v_j).zero_()  # contiguous: summed in place
        for r0, r1, partial in row_blocks:
            log_tile("backward", r0, c0)
            q_i, do_i, neg_lse_i, delta_i, *factor_i = row_data[r0]
            # bit for bit the forward's scale Q_i. A power of two (d = 16, 64, 256 without a softcap) scales
            # the product exactly, so it goes in as baddbmm's alpha; otherwise Q_i is scaled per tile, in
            # reused memory (a fresh 256 KB tensor per tile is an allocation and its page faults).
            qs_i = q_i if exact_alpha else torch.mul(q_i, factor, out=qs_buffer.get(q_i.shape, q_i))
            if factor_i:
                do_i = torch.mul(do_i, factor_i[0], out=do_buffer.get(do_i.shape, do_i))
            dq_i = local.dq.get(r0)
            if dq_i is None:
                dq_i = local.dq[r0] = torch.zeros_like(q_i)
            shape = (q_i.shape[0], q_i.shape[1], c1 - c0)
            tanh = None
            if softcap:  # t = tanh(scale Q_i K_j^T / c), kept for dS_raw = dS (1 - t^2). (1 - t^2 loses digits
                # near |t| = 1, but so does PyTorch's own tanh backward: sech^2 made no difference to flash-attn's criterion.)
                tanh = torch.bmm(qs_i, k_j.transpose(1, 2), out=tanh_buffer.get(shape, q_i)).tanh_()
            if score_mod is None and tanh is None:  # S - lse = (scale Q_i) K_j^T - lse_i in one product: (B Hk, G bq, bk)
                probs = torch.baddbmm(neg_lse_i, qs_i, k_j.transpose(1, 2), alpha=factor if exact_alpha else 1.0,
                                      out=probs_buffer.get(shape, q_i))
            elif score_mod is None:  # S - lse = c t - lse, with c t rounded first as the forward rounds it (not fused)
                probs = torch.mul(tanh, softcap, out=probs_buffer.get(shape, q_i)).add_(neg_lse_i)
            else:  # S = score_mod(scale Q_i K_j^T, softcapped), recorded for its backward; then S - lse
                fresh = not score_mod.adds_bias  # autograd through the score_mod keeps raw: not in a reused buffer
                out = None if fresh else probs_buffer.get(shape, q_i)
                raw = torch.bmm(qs_i, k_j.transpose(1, 2), out=out) if tanh is None else torch.mul(tanh, softcap, out=out)
                probs = score_mod.record(raw, neg_lse_i, heads_view, r0, (r0, r1), (c0, c1))
            added = partial and getattr(mask, "additive", False)  # a float mask: added, -inf and all
            if added:
                mask.apply(heads_view(probs, r0), (r0, r1), (c0, c1))
            # P = exp(S - lse). Hidden keys get P = 0: a float mask's -inf is flushed to 0 by the exp; for the
            # others S - lse is finite but may be large: capped so exp stays finite, then zeroed by the mask
            hidden = partial and not added
            exp_flush_tiny_(probs, hidden_cap(probs.dtype) if hidden else None, flush or (added and mask.hides))
            if hidden:
                mask.zero_hidden(heads_view(probs, r0), (r0, r1), (c0, c1))
            kept = probs
            if dropout is not None:  # Z / (1 - p) as (B Hk, G bq, bk): the heads layout's memory in the grouped order
                keep = dropout.multiplier((r0, r1), (c0, c1), probs.dtype).view(shape)
                kept = torch.mul(probs, keep, out=kept_buffer.get(shape, q_i))  # P Z / (1 - p)
            _add_row_sums(dv_j, kept, do_i, 1.0)  # dV_j += P^T dO_i: (bk, G bq) @ (G bq, d_v)
            dp = torch.bmm(do_i, v_j.transpose(1, 2), out=dp_buffer.get(shape, q_i))  # dP = dO V^T
            if dropout is not None:
                dp.mul_(keep)  # the gradient reaches only the weights that were kept
            ds = probs.mul_(dp.sub_(delta_i))  # dS = P * (dP - D), in P's memory
            if mask_grad is not None:  # the mask is added last: its gradient is dS itself
                tile = mask_slice(mask_grad, (r0, r1), (c0, c1))
                tile += heads_view(ds, r0).sum_to_size(tile.shape)
            if score_mod is not None:
                ds = score_mod.backward(ds)  # d(raw scores) = dS through the score_mod's own backward
            if tanh is not None:  # through the softcap: dS_raw = dS - dS t^2
                ds.addcmul_(ds, tanh.square_(), value=-1.0)
            dq_i.baddbmm_(ds, k_j, alpha=scale)  # scale (G bq, bk) @ (bk, d)
            _add_row_sums(dk_j, ds, q_i, scale)  # dK_j += scale dS^T Q_i
        dk3[:, c0:c1] += dk_j  # key blocks are disjoint: no two threads write the same rows
        dv3[:, c0:c1] += dv_j

    units = sorted(rows_of.items())
    # A dropout's generator is shared state, and so is a mask gradient whose key axis broadcasts: one thread then.
    shared = dropout is not None or (mask_grad is not None and mask_grad.shape[-1] != kv_len)
    run_units(units, key_block, cost=lambda unit: len(unit[1]), sequential=logging_tiles() or shared)
    _add_sums(dq, dk, dv, all_dq, dk3, dv3, heads_view, group)
    return dq, dk, dv


def _row_blocks(per_row, grad_out, mask, q_len: int, kv_len: int, block_q: int, block_k: int, group: int):
    """The tiles the mask leaves, by key block, and each row block's grouped slices.   -> (rows_of, row_data)

    rows_of: (c0, c1) -> [(r0, r1, partial), ...], the row blocks that see the key block.
    row_data: r0 -> [Q_i, dO_i, -lse_i, D_i (, exp(-lse remainder)_i)], each (B Hk, G bq, .); GQA's
    stacked rows are a copy of dO already, so the remainder's factor is folded into it once here.
    """
    rows_of, row_data = {}, {}
    for (r0, r1), tiles in zip(block_spans(q_len, block_q), visible_tiles(mask, q_len, kv_len, block_q, block_k)):
        if tiles:
            q_i, do_i, *rest = (group_rows(t, (r0, r1), group).reshape(-1, group * (r1 - r0), t.shape[-1])
                                for t in per_row)  # (B Hk, G bq, .)
            own = do_i.untyped_storage().data_ptr() != grad_out.untyped_storage().data_ptr()
            if rest[2:] and own:  # GQA stacks a group's rows in a copy of dO: scaled there once, not per tile
                do_i.mul_(rest.pop())
            row_data[r0] = [q_i, do_i, *rest]
        for c0, c1, partial in tiles:
            rows_of.setdefault((c0, c1), []).append((r0, r1, partial))
    return rows_of, row_data


def _add_sums(dq, dk, dv, all_dq: list, dk3, dv3, heads_view, group: int) -> None:
    """Every thread's dQ_i sums into dQ; dK and dV from their accumulators where those were temporaries."""
    for sums in all_dq:
        for r0, dq_i in sums.items():
            r1 = r0 + dq_i.shape[1] // group
            dq[..., r0:r1, :] += heads_view(dq_i, r0)
    for grad, acc in ((dk, dk3), (dv, dv3)):
        if acc.data_ptr() != grad.data_ptr():  # a temporary (another dtype or layout): add it now
            grad += acc.view(grad.shape)


SUM_ROWS = 64  # rows summed in one float32 product of dK and dV (torch's CPU kernel sums 32-64)


def _add_row_sums(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float) -> None:
    """acc += alpha a^T b, summed over the rows of a and b SUM_ROWS at a time.   a (n, R, k), b (n, R, e), acc (n, k, e)

    A tile of more rows keeps its other products large (fewer, faster calls), while these two,
    which add up the rows, stay as accurate as with 64-row tiles: one product over 128 or 256
    rows in float32 reached 2.1-2.5x the error of torch's own kernel on dK and dV."""
    for start in range(0, a.shape[1], SUM_ROWS):
        acc.baddbmm_(a[:, start:start + SUM_ROWS].transpose(1, 2), b[:, start:start + SUM_ROWS], alpha=alpha)


def hidden_cap(dtype: torch.dtype) -> float:
    """Where the backward caps S - lse before exp. A visible key has S - lse <= 0, so the cap
    touches only hidden keys, whose exp then stays finite (float16 overflows at exp(11.1))
    and becomes exactly 0 when multiplied by the mask's 0."""
    return min(50.0, math.log(torch.finfo(dtype).max) - 1.0)


def _accumulator(grad: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``grad`` as (batch x heads, n, e) to accumulate into in place, or zeros to add at the end
    when it cannot be viewed so (a slice with other strides) or has another dtype (a ring's float32 sums)."""
    if grad.dtype == dtype:
        try:
            return grad.view(-1, *grad.shape[-2:])
        except RuntimeError:
            pass
    return torch.zeros((math.prod(grad.shape[:-2]), *grad.shape[-2:]), dtype=dtype, device=grad.device)
