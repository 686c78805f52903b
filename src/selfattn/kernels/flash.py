"""Flash attention: exact attention that never holds the q_len x kv_len score matrix.

    O = softmax(scale Q K^T + mask) V, computed tile by tile:
    for each block of query rows:   for each block of keys it can see:
        S = scale Q_i K_j^T (+ mask tile)      (..., bq, bk): the only score tile alive
        fold S, V_j into the online softmax (m, l, acc)      kernels/online_softmax.py
    O_i = acc / l,   lse_i = m + log l

Memory: one bq x bk tile per step, plus O and lse: linear in the length. A causal mask
is not applied as a dense mask: key blocks entirely in a row block's future are never
visited, and only tiles that cross the diagonal get a mask. The backward pass
(FlashAttention-2, Dao 2023) saves only Q, K, V, O and lse, and recomputes each tile's
probabilities from lse: P = exp(S - lse), never storing them:

    D_i = rowsum(dO_i * O_i)
    dV_j += P^T dO_i      dP = dO_i V_j^T      dS = P * (dP - D_i)
    dQ_i += scale dS K_j   dK_j += scale dS^T Q_i

Same semantics as ``selfattn.scaled_dot_product_attention``: bool masks (True = may
attend) and float masks (added), torch's ``causal_upper_left`` / ``causal_lower_right``
objects (both skip blocks), q_len != kv_len, GQA, broadcast leading axes; a row with no
visible key gives zeros and lse = -inf, with zero gradients.
"""

from __future__ import annotations

import functools
import math

import torch
from torch.autograd.function import once_differentiable

from selfattn.attention.functional import check_attention_inputs, expand_kv_heads, is_causal_bias
from selfattn.errors import OptionError, ShapeError
from selfattn.kernels.online_softmax import (
    NEG_INF,
    online_softmax_finish,
    online_softmax_start,
    online_softmax_update,
    online_sum_update,
)

# Default tile sizes, measured on this project's 2-core CPU (bench/attention.py at N = 4096,
# 8 heads, d = 64; tiles 128x256 to 1024x1024 tried): each step runs ~5-10 torch calls on
# a (heads, bq, bk) tile, so a tile must be large enough that their fixed cost (~5-10 us
# each) vanishes next to the arithmetic, yet small enough that a causal mask still skips
# most of the upper triangle. 512 x 512 was fastest without a mask (1.06-1.14x SDPA
# forward, against 1.36-1.41x for 256 x 512) and level with the others when causal.
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512
# The backward sums dK and dV over the rows of a tile in one float32 product; over 256
# rows that rounding reached 2.5x the error of torch's own kernel (which sums 32-64 rows
# at a time), so the backward never takes more than 64 rows per tile.
BACKWARD_BLOCK_Q = 64


def flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    block_q: int | None = None,
    block_k: int | None = None,
    return_lse: bool = False,
):
    """O = softmax(scale Q K^T + mask) V, tile by tile.   (..., Hq, q_len, d), (..., Hk, kv_len, d), (..., Hk, kv_len, d_v)

    Returns O (..., Hq, q_len, d_v), or (O, lse) with return_lse=True, lse (..., Hq, q_len)
    being log sum_j exp(s_ij) of each row (natural log; -inf for a row with no visible key).
    is_causal: top-left aligned, as torch; pass ``torch.nn.attention.bias.causal_lower_right``
    as attn_mask for bottom-right. block_q / block_k: tile sizes (default 512 x 512).
    Differentiable in query, key, value (and a float mask); the backward pass recomputes
    the tiles instead of storing them.
    """
    causal_offset, attn_mask = _causal_form(attn_mask, is_causal, query, key)
    output, lse = flash_with_offset(query, key, value, attn_mask, causal_offset, scale, enable_gqa, block_q, block_k)
    return (output, lse) if return_lse else output


def flash_with_offset(query, key, value, attn_mask, causal_offset: int | None, scale=None, enable_gqa=False,
                      block_q=None, block_k=None):
    """``flash_attention`` with the causal rule given as a number: row i sees keys j <= i + offset
    (None: no causal rule). For callers that know their alignment, such as the modules.   -> (O, lse)"""
    check_attention_inputs(query, key, value, attn_mask, 0.0, False, enable_gqa)
    block_q = check_block_size("block_q", block_q, DEFAULT_BLOCK_Q)
    block_k = check_block_size("block_k", block_k, DEFAULT_BLOCK_K)
    if enable_gqa:
        key, value = expand_kv_heads(key, value, query.shape[-3])
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    query, key, value = _broadcast_leading(query, key, value)
    return _FlashAttention.apply(query, key, value, attn_mask, causal_offset, float(scale), block_q, block_k)


def _causal_form(attn_mask, is_causal: bool, query: torch.Tensor, key: torch.Tensor):
    """(causal offset or None, remaining mask): row i sees keys j <= i + offset.

    Top-left (is_causal, causal_upper_left) has offset 0; bottom-right (causal_lower_right)
    kv_len - q_len. Kept as a number, the causal mask costs nothing and lets whole blocks go.
    """
    if is_causal_bias(attn_mask):
        from torch.nn.attention.bias import CausalVariant

        if is_causal:
            raise OptionError("give either attn_mask or is_causal=True, not both (combine the masks first)")
        sizes = (attn_mask.seq_len_q, attn_mask.seq_len_kv)
        if sizes != (query.shape[-2], key.shape[-2]):
            raise ShapeError(
                f"the causal mask is for q_len x kv_len = {sizes[0]} x {sizes[1]}, but the inputs are "
                f"{query.shape[-2]} x {key.shape[-2]}"
            )
        lower_right = attn_mask.variant == CausalVariant.LOWER_RIGHT
        return (attn_mask.seq_len_kv - attn_mask.seq_len_q if lower_right else 0), None
    if is_causal:
        if attn_mask is not None:
            raise OptionError("give either attn_mask or is_causal=True, not both (combine the masks first)")
        return 0, None
    return None, attn_mask


def check_block_size(name: str, value, default: int | None) -> int | None:
    """A tile size: a positive int, or None for ``default``; anything else is an OptionError naming ``name``."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name} must be a positive integer, got {value!r}")
    return value


def _broadcast_leading(query, key, value):
    """Expand the leading (batch, head) axes of q, k, v to one shape (views; autograd sums them back)."""
    lead = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
    return (
        query.expand(*lead, *query.shape[-2:]),
        key.expand(*lead, *key.shape[-2:]),
        value.expand(*lead, *value.shape[-2:]),
    )


def key_blocks(row_start: int, row_end: int, kv_len: int, block_k: int, causal_offset: int | None):
    """The key blocks rows [row_start, row_end) can see, each as (start, end, needs_causal_mask)."""
    last = kv_len if causal_offset is None else min(kv_len, row_end + causal_offset)  # keys < last are visible to some row
    blocks = []
    for start in range(0, max(last, 0), block_k):
        end = min(start + block_k, last)
        partial = causal_offset is not None and end - 1 > row_start + causal_offset
        blocks.append((start, end, partial))
    return blocks


def score_tile(
    q_scaled, key, attn_mask, causal_offset, rows: tuple[int, int], cols: tuple[int, int], out: TileBuffer | None = None
) -> torch.Tensor:
    """S = scale Q_i K_j^T plus the mask's tile (-inf where hidden).   -> (..., bq, bk)

    A fresh tensor, or a view of ``out``'s memory (valid until the next tile).
    """
    (r0, r1), (c0, c1) = rows, cols
    keys_t = key[..., c0:c1, :].transpose(-2, -1)  # (..., d, bk)
    if out is None:
        scores = q_scaled @ keys_t  # (..., bq, d) @ (..., d, bk) -> (..., bq, bk)
    else:
        shape = (*torch.broadcast_shapes(q_scaled.shape[:-2], keys_t.shape[:-2]), q_scaled.shape[-2], c1 - c0)
        scores = torch.matmul(q_scaled, keys_t, out=out.get(shape, q_scaled))
    if attn_mask is not None:
        tile = mask_tile(attn_mask, rows, cols)
        if tile.dtype == torch.bool:
            scores.masked_fill_(~tile, NEG_INF)
        else:
            scores.add_(tile.to(scores.dtype))
    if causal_offset is not None and c1 - 1 > r0 + causal_offset:  # the tile crosses the diagonal
        # Added as 0 / -inf: on CPU an add is several times cheaper than masked_fill_.
        scores.add_(causal_bias(r1 - r0, c1 - c0, r0 + causal_offset - c0, scores.dtype, scores.device))
    return scores


def mask_tile(attn_mask: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
    """The mask's part for these rows and keys; broadcast axes (size 1) stay whole."""
    r = slice(*rows) if attn_mask.dim() >= 2 and attn_mask.shape[-2] > 1 else slice(None)
    c = slice(*cols) if attn_mask.shape[-1] > 1 else slice(None)
    return attn_mask[..., r, c]


@functools.lru_cache(maxsize=16)
def causal_bias(rows: int, cols: int, diagonal: int, dtype: torch.dtype, device) -> torch.Tensor:
    """0 where tile key j <= tile row i + diagonal, -inf after.   -> (rows, cols)

    Every tile on the diagonal of a square grid has the same pattern, so it is built once.
    """
    i = torch.arange(rows, device=device)
    j = torch.arange(cols, device=device)
    visible = j[None, :] <= i[:, None] + diagonal  # (rows, cols)
    return torch.zeros((rows, cols), dtype=dtype, device=device).masked_fill_(~visible, NEG_INF)


def flash_forward(q, k, v, attn_mask, causal_offset, scale: float, block_q: int, block_k: int):
    """The tiled forward pass.   -> O (..., q_len, d_v), lse (..., q_len)

    When every score is provably small enough for exp (``exp_is_bounded``), the running
    max is not needed and each tile is folded with ``online_sum_update`` (two passes over
    the tile fewer); otherwise with the full online softmax. Both are exact.
    """
    q_len, d_v = q.shape[-2], v.shape[-1]
    output = q.new_empty((*q.shape[:-1], d_v))
    lse = q.new_empty(q.shape[:-1])
    bounded = exp_is_bounded(q, k, scale, attn_mask)
    buffer = TileBuffer()
    for r0 in range(0, q_len, block_q):
        r1 = min(r0 + block_q, q_len)
        q_scaled = q[..., r0:r1, :] * scale  # (..., bq, d): scaled once per row block
        state = online_softmax_start(q_scaled.shape[:-1], d_v, q)
        if bounded:
            state = state._replace(m=torch.zeros_like(state.m))
        for c0, c1, _ in key_blocks(r0, r1, k.shape[-2], block_k, causal_offset):
            scores = score_tile(q_scaled, k, attn_mask, causal_offset, (r0, r1), (c0, c1), out=buffer)
            if bounded:
                state = online_sum_update(state, scores, v[..., c0:c1, :])
            else:
                state = online_softmax_update(state, scores, v[..., c0:c1, :]).state
        output[..., r0:r1, :], lse[..., r0:r1] = online_softmax_finish(state)
    return output, lse


# exp overflows float32 at 88.7 and float64 at 709.8; a margin of 8 leaves room for the
# row sums (up to kv_len terms, checked separately) and keeps exp(-bound) a normal number.
EXP_MARGIN = 8.0


def exp_is_bounded(q: torch.Tensor, k: torch.Tensor, scale: float, attn_mask: torch.Tensor | None) -> bool:
    """Whether every finite score s = scale q.k (+ mask) satisfies |s| + log(kv_len) < log(max float) - 8.

    Cauchy-Schwarz: |scale q_i . k_j| <= |scale| max_i |q_i| max_j |k_j|. A bool mask adds
    only -inf; a float mask adds its own largest and smallest finite values (one pass over
    it). Then exp of any score, and any row sum, stays a normal finite number.
    """
    if not q.numel() or not k.numel():
        return False
    bound = abs(scale) * float(torch.linalg.vector_norm(q, dim=-1).amax()) * float(torch.linalg.vector_norm(k, dim=-1).amax())
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        finite = attn_mask[torch.isfinite(attn_mask)]
        if finite.numel():
            bound += float(finite.abs().amax())
    return bound + math.log(k.shape[-2]) < math.log(torch.finfo(q.dtype).max) - EXP_MARGIN


class TileBuffer:
    """One block of memory reused for every score tile of a call: a fresh multi-megabyte
    tile per step costs page faults, which showed up as a large part of the matmul time."""

    def __init__(self) -> None:
        self.flat: torch.Tensor | None = None

    def get(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        size = math.prod(shape)
        if self.flat is None or self.flat.numel() < size or self.flat.dtype != like.dtype:
            self.flat = torch.empty(size, dtype=like.dtype, device=like.device)
        return self.flat[:size].view(shape)


def flash_backward(grad_out, q, k, v, output, lse, attn_mask, causal_offset, scale, block_q, block_k, mask_grad: bool):
    """FlashAttention-2's backward: dQ, dK, dV (and d mask) tile by tile, from lse."""
    q_len, kv_len = q.shape[-2], k.shape[-2]
    dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    dmask = torch.zeros(attn_mask.shape, dtype=attn_mask.dtype, device=attn_mask.device) if mask_grad else None
    delta = (grad_out * output).sum(dim=-1, keepdim=True)  # D = rowsum(dO * O): (..., q_len, 1)
    # exp(S - lse) with lse = +inf for rows that see nothing: their P is 0, not exp(-inf + inf).
    lse_safe = torch.where(lse == NEG_INF, torch.full_like(lse, float("inf")), lse)[..., None]  # (..., q_len, 1)
    probs_buffer, dp_buffer = TileBuffer(), TileBuffer()
    for c0 in range(0, kv_len, block_k):
        c1 = min(c0 + block_k, kv_len)
        k_j, v_j = k[..., c0:c1, :], v[..., c0:c1, :]
        first_row = 0 if causal_offset is None else max(0, c0 - causal_offset)  # rows before it cannot see this block
        for r0 in range(first_row - first_row % block_q, q_len, block_q):
            r1 = min(r0 + block_q, q_len)
            q_i = q[..., r0:r1, :]
            probs = score_tile(q_i * scale, k, attn_mask, causal_offset, (r0, r1), (c0, c1), out=probs_buffer)
            probs = probs.sub_(lse_safe[..., r0:r1, :]).exp_()  # P = exp(S - lse): (..., bq, bk)
            do_i = grad_out[..., r0:r1, :]
            dv[..., c0:c1, :] += probs.transpose(-2, -1) @ do_i  # (..., bk, bq) @ (..., bq, d_v)
            dp = torch.matmul(do_i, v_j.transpose(-2, -1), out=dp_buffer.get(probs.shape, probs))  # (..., bq, bk)
            ds = probs.mul_(dp.sub_(delta[..., r0:r1, :]))  # dS = P * (dP - D), in P's memory
            if dmask is not None:
                tile = mask_tile(dmask, (r0, r1), (c0, c1))
                tile += ds.sum_to_size(tile.shape)
            dq[..., r0:r1, :] += (ds @ k_j) * scale  # (..., bq, bk) @ (..., bk, d)
            dk[..., c0:c1, :] += (ds.transpose(-2, -1) @ q_i) * scale  # (..., bk, bq) @ (..., bq, d)
    return dq, dk, dv, dmask


class _FlashAttention(torch.autograd.Function):
    """Saves Q, K, V, O and lse only; the backward recomputes every tile."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, causal_offset, scale, block_q, block_k):
        output, lse = flash_forward(q, k, v, attn_mask, causal_offset, scale, block_q, block_k)
        ctx.save_for_backward(q, k, v, output, lse, attn_mask)
        ctx.settings = (causal_offset, scale, block_q, block_k)
        ctx.mark_non_differentiable(lse)
        return output, lse

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: say so instead of failing inside it
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, output, lse, attn_mask = ctx.saved_tensors
        causal_offset, scale, block_q, block_k = ctx.settings
        mask_grad = attn_mask is not None and ctx.needs_input_grad[3]
        rows = min(block_q, BACKWARD_BLOCK_Q)
        dq, dk, dv, dmask = flash_backward(
            grad_out.contiguous(), q, k, v, output, lse, attn_mask, causal_offset, scale, rows, block_k, mask_grad
        )
        return dq, dk, dv, dmask, None, None, None, None

