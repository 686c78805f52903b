"""Trace flash attention's online softmax block by block, for the explainer.

The flash variant is the seed's attention (queries, keys and values are X itself; the
scores x_i . x_j are not scaled, so every number lines up with the seed's walkthrough),
computed the way FlashAttention computes it: the keys are cut into blocks of
``block_size`` and each block is folded into the running (m, l, acc) of every row.

Nothing here is new arithmetic. The scores come from the kernel's own ``score_tile``,
the updates from ``online_softmax_update`` and the result from
``online_softmax_finish``; the loop is the one ``flash_forward`` runs, replayed so that
each block's numbers can be kept. ``flash_attention`` then runs the real kernel on the
same inputs, ``attention_probs_from_lse`` rebuilds the weights from its lse, and the
reference attention (``scaled_dot_product_attention_with_weights``) gives the plain
softmax result to compare with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfattn.attention.functional import scaled_dot_product_attention_with_weights
from selfattn.kernels.flash import flash_attention, tile_mask
from selfattn.kernels.tile_sizes import check_block_size
from selfattn.kernels.flash_tiles import score_tile
from selfattn.kernels.online_softmax import online_softmax_finish, online_softmax_start, online_softmax_update
from selfattn.kernels.probs_from_lse import attention_probs_from_lse

DEFAULT_BLOCK_SIZE = 2


@dataclass(frozen=True)
class FlashBlock:
    """One key block [start, end) folded into the running numbers of every query row."""

    start: int
    end: int
    scores: torch.Tensor  # (n, block): s_ij for the keys of this block
    block_max: torch.Tensor  # (n,): max of the block's scores
    m_before: torch.Tensor  # (n,): the running max before the block (-inf at first)
    m_after: torch.Tensor  # (n,): m' = max(m, block max)
    rescale: torch.Tensor  # (n,): r = exp(m - m'), 0 for the first block
    exp: torch.Tensor  # (n, block): exp(s - m')
    exp_sum: torch.Tensor  # (n,): sum of exp(s - m') over the block
    l_before: torch.Tensor  # (n,)
    l_after: torch.Tensor  # (n,): l' = r l + sum exp(s - m')
    acc_before: torch.Tensor  # (n, d_v)
    acc_after: torch.Tensor  # (n, d_v): acc' = r acc + exp(s - m') V_block


@dataclass(frozen=True)
class FlashTrace:
    """Flash attention over one sentence: the blocks, the result, and the checks against plain softmax."""

    block_size: int
    scale: float
    blocks: list[FlashBlock]
    online_output: torch.Tensor  # (n, d_v): acc / l after the last block, from online_softmax_finish
    online_lse: torch.Tensor  # (n,): m + log l after the last block
    output: torch.Tensor  # (n, d_v): flash_attention's output
    lse: torch.Tensor  # (n,): flash_attention's log-sum-exp of every row
    plain_output: torch.Tensor  # (n, d_v): softmax(S) V from the reference attention
    plain_weights: torch.Tensor  # (n, n): softmax(S) from the same reference
    weights_from_lse: torch.Tensor  # (n, n): exp(s_ij - lse_i) from attention_probs_from_lse

    @property
    def max_difference(self) -> float:
        """Largest |flash output - plain output| over every token and component."""
        return float((self.output - self.plain_output).abs().max())

    @property
    def weights_max_difference(self) -> float:
        """Largest |exp(s - lse) - softmax(s)| over the whole weight matrix."""
        return float((self.weights_from_lse - self.plain_weights).abs().max())


def trace_flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    block_size: int | None = DEFAULT_BLOCK_SIZE,
    scale: float = 1.0,
) -> FlashTrace:
    """Flash attention of one head, block by block.   q, k (1, n, d), v (1, n, d_v); mask (1, n, n) or None"""
    block_size = check_block_size("--block-size", block_size, DEFAULT_BLOCK_SIZE)
    n, d_v = q.shape[-2], v.shape[-1]
    q_scaled = q * scale  # (1, n, d), as the kernel scales a row block once
    state = online_softmax_start(q_scaled.shape[:-1], d_v, q)  # m, l: (1, n, 1); acc: (1, n, d_v)
    blocks = []
    # One row block holding every query, so every row sees the same key blocks.
    mask = tile_mask(attn_mask, None, n, k.shape[-2])
    for start in range(0, k.shape[-2], block_size):
        end = min(start + block_size, k.shape[-2])
        scores = score_tile(q_scaled, k, mask, (0, n), (start, end), partial=mask is not None)  # (1, n, block)
        update = online_softmax_update(state, scores.clone(), v[..., start:end, :])  # the update overwrites its scores
        after = update.state
        blocks.append(
            FlashBlock(
                start=start,
                end=end,
                scores=scores[0],
                block_max=update.block_max[0, :, 0],
                m_before=state.m[0, :, 0],
                m_after=after.m[0, :, 0],
                rescale=update.rescale[0, :, 0],
                exp=update.exp[0],
                exp_sum=update.exp[0].sum(dim=-1),
                l_before=state.l[0, :, 0],
                l_after=after.l[0, :, 0],
                acc_before=state.acc[0],
                acc_after=after.acc[0],
            )
        )
        state = after
    online_output, online_lse = online_softmax_finish(state)  # (1, n, d_v), (1, n)

    output, lse = flash_attention(q, k, v, attn_mask, scale=scale, block_q=n, block_k=block_size, return_lse=True)
    weights_from_lse = attention_probs_from_lse(q, k, lse, attn_mask=attn_mask, scale=scale)  # (1, n, n)
    plain_output, plain_weights = scaled_dot_product_attention_with_weights(q, k, v, attn_mask, scale=scale)  # (1, n, d_v), (1, n, n)
    return FlashTrace(
        block_size=block_size,
        scale=scale,
        blocks=blocks,
        online_output=online_output[0],
        online_lse=online_lse[0],
        output=output[0],
        lse=lse[0],
        plain_output=plain_output[0],
        plain_weights=plain_weights[0],
        weights_from_lse=weights_from_lse[0],
    )
