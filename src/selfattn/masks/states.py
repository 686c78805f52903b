"""Block states, the one vocabulary every mask and the tiled kernel share.

A tiled kernel asks a mask, per (row block, key block), one of three answers: EMPTY (no
pair may attend: skip the block), FULL (every pair may: no mask needed) or PARTIAL (mask
this block only). This leaf holds those answers and the small helpers that make and cut
them, so that the masks, their reductions and the kernels import it and not each other.
"""

from __future__ import annotations

import torch

# One name per line, so that griffe (the API reference) sees each constant and its docstring.
EMPTY = 0
"""Block state: no pair in the block may attend; a tiled kernel skips the block."""
FULL = 1
"""Block state: every pair in the block may attend; no mask is needed there."""
PARTIAL = 2
"""Block state: some pairs may attend; the block is computed and masked."""
BLOCK_STATE_NAMES = {EMPTY: "empty", FULL: "full", PARTIAL: "partial"}
"""Block state -> its name: {EMPTY: "empty", FULL: "full", PARTIAL: "partial"}."""
NEG_INF = float("-inf")


def block_bounds(length: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Starts and ends of consecutive blocks of ``block`` covering range(length).   -> (n,), (n,) int64"""
    starts = torch.arange(0, length, block, dtype=torch.int64)
    return starts, torch.clamp(starts + block, max=length)


def states_from(empty: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """int8 states from two bool grids (a block both empty and full cannot happen for non-empty blocks)."""
    states = torch.full(empty.shape, PARTIAL, dtype=torch.int8)
    states[full] = FULL
    states[empty] = EMPTY
    return states


def mask_slice(mask: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
    """A dense mask's part for these rows and keys; broadcast axes (size 1) stay whole (a view)."""
    r = slice(*rows) if mask.dim() >= 2 and mask.shape[-2] > 1 else slice(None)
    c = slice(*cols) if mask.shape[-1] > 1 else slice(None)
    return mask[..., r, c]
