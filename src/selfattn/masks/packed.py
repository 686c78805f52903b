"""Windows on packed sequences: each token's position counted within its own sequence.

    distance(i, j) = place_q(i) - place_k(j)          query i sees key j when
    -right <= distance(i, j) <= left                  (None: that side unbounded)

``place_q`` / ``place_k`` give each packed query and key its position inside its own
sequence (flash-attn's varlen calls align them bottom-right per sequence). Joined with
``DocumentMask`` (``&``), which keeps each sequence to its own keys, this is the causal or
local mask of ``flash_attn_varlen_func`` as a rule: the block states come from the
places' extremes per block, so nothing of size total_q x total_k is ever made.
"""

from __future__ import annotations

import torch

from selfattn.masks.states import states_from
from selfattn.masks.structured import StructuredMask


class PackedWindowMask(StructuredMask):
    """M[i, j] = -right <= place_q[i] - place_k[j] <= left.   (total_q, total_k)

    Args:
        place_q: int64 (total_q,), each query's position within its sequence.
        place_k: int64 (total_k,), each key's position within its sequence.
        left: keys up to this far before the query's position, or None (unbounded).
        right: keys up to this far after it, or None (unbounded).
    """

    def __init__(self, place_q: torch.Tensor, place_k: torch.Tensor, left: int | None, right: int | None) -> None:
        self.place_q, self.place_k = place_q.long(), place_k.long()
        self.left, self.right = left, right
        self.q_len, self.kv_len = len(place_q), len(place_k)

    def allowed(self, rows, cols):
        """The rule at query rows ``rows`` (r,) and keys ``cols`` (c,).   -> bool (r, c)"""
        distance = self.place_q.to(rows.device)[rows][:, None] - self.place_k.to(cols.device)[cols][None, :]
        keep = torch.ones(distance.shape, dtype=torch.bool, device=distance.device)
        if self.left is not None:
            keep &= distance <= self.left
        if self.right is not None:
            keep &= distance >= -self.right
        return keep

    def block_states(self, block_q, block_k, q_len=None):
        """EMPTY / FULL / PARTIAL per block, from the smallest and largest distance in it.

        A block whose rows or keys span two sequences has a wider range of places than
        any pair in it, so it may be called PARTIAL where it is not; never the reverse.
        """
        q_low, q_high = _block_extremes(self.place_q, block_q)
        k_low, k_high = _block_extremes(self.place_k, block_k)
        nearest = q_low[:, None] - k_high[None, :]  # the smallest distance in each block
        farthest = q_high[:, None] - k_low[None, :]
        left = self.left if self.left is not None else float("inf")
        right = self.right if self.right is not None else float("inf")
        empty = (farthest < -right) | (nearest > left)
        full = (nearest >= -right) & (farthest <= left)
        return states_from(empty, full)


def _block_extremes(places: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of each block of ``block`` consecutive entries.   (n,) -> (ceil(n / block),) twice"""
    n_blocks = -(-len(places) // block)
    padded_low = torch.full((n_blocks * block,), torch.iinfo(torch.int64).max, dtype=torch.int64)
    padded_high = torch.full((n_blocks * block,), torch.iinfo(torch.int64).min, dtype=torch.int64)
    padded_low[:len(places)] = places
    padded_high[:len(places)] = places
    return padded_low.view(n_blocks, block).amin(dim=1), padded_high.view(n_blocks, block).amax(dim=1)
