"""The block states of a dense mask tensor, reduced once per call and coarsened for every tile size.

A bool or float mask given as a tensor has no rule to read its blocks from: each state
(EMPTY, FULL, PARTIAL) needs a pass over the whole tensor. The kernel asks for several
tile sizes in one call (the forward tries 512, 256 and 128; the backward 128-row blocks),
so the tensor is reduced once, to a map of BASE_ROWS x BASE_COLS blocks, and every tile
size that is a multiple of it is read off that map: a larger block is EMPTY if all its
base blocks are, FULL if all are. Other sizes (tests force tiny tiles) reduce the tensor
directly.
"""

from __future__ import annotations

import torch

from selfattn.masks.structured import EMPTY, FULL, NEG_INF, states_from, states_of_dense

BASE_ROWS, BASE_COLS = 64, 128  # a divisor of every row block the kernel chooses; its smallest key block


class DenseStates:
    """``states(block_q, block_k, rows)`` for one mask tensor, from one reduction.

    Args:
        mask: bool (True = visible) or float (-inf hidden, 0 untouched) tensor,
            (..., q_len or 1, kv_len); kept, not copied.
    """

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask.detach()  # only read: a mask that requires grad gets its gradient elsewhere
        self._maps: dict[tuple[int, int, int], torch.Tensor] = {}
        self.extent: tuple[float, float] | None = None  # a float mask's (min, max), when the reduction found them

    def states(self, block_q: int, block_k: int, rows: int) -> torch.Tensor:
        """int8 (ceil(rows / block_q), ceil(kv_len / block_k)) of EMPTY / FULL / PARTIAL."""
        key = (block_q, block_k, rows)
        if key not in self._maps:
            if block_q % BASE_ROWS == 0 and block_k % BASE_COLS == 0:
                base = self.states(BASE_ROWS, BASE_COLS, rows) if (block_q, block_k) != (BASE_ROWS, BASE_COLS) else None
                if base is None:
                    extremes = block_extremes(self.mask, BASE_ROWS, BASE_COLS)
                    if extremes is not None:
                        low, high = extremes
                        self.extent = (float(low.min()), float(high.max()))
                        self._maps[key] = states_from(high == NEG_INF, (low == 0) & (high == 0))
                    else:
                        self._maps[key] = states_of_dense(self.mask, BASE_ROWS, BASE_COLS, rows)
                else:
                    self._maps[key] = coarsen_states(base, block_q // BASE_ROWS, block_k // BASE_COLS)
            else:
                self._maps[key] = states_of_dense(self.mask, block_q, block_k, rows)
        return self._maps[key]


def block_extremes(mask: torch.Tensor, block_q: int, block_k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(min, max) of a float mask over each block and every leading axis, two reductions and no
    bool copy of the tensor.   -> (n_r, n_c) twice; None where the blocks do not tile the mask
    (its lengths not multiples of the block, a row axis of 1, a layout that does not view)."""
    if mask.dtype == torch.bool or mask.dim() < 2:
        return None
    rows, cols = mask.shape[-2:]
    if rows == 1 or rows % block_q or cols % block_k:
        return None
    try:
        blocks = mask.view(-1, rows // block_q, block_q, cols // block_k, block_k)
    except RuntimeError:  # an expanded or strided mask: the exact reduction instead
        return None
    return blocks.amin(dim=(0, 2, 4)), blocks.amax(dim=(0, 2, 4))


def coarsen_states(states: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Join rows x cols blocks of a map into one: EMPTY if all were, FULL if all were, else PARTIAL.

    Args:
        states: int8 (n_r, n_c), a map of EMPTY / FULL / PARTIAL.
        rows: blocks of the map joined down the rows.
        cols: blocks joined along the keys.

    Returns:
        int8 (ceil(n_r / rows), ceil(n_c / cols)). The last blocks may cover fewer
            blocks of the map, as the last tiles cover fewer rows or keys.
    """
    n_r, n_c = states.shape
    big_r, big_c = -(-n_r // rows), -(-n_c // cols)
    padded_empty = torch.ones(big_r * rows, big_c * cols, dtype=torch.bool)
    padded_full = torch.ones(big_r * rows, big_c * cols, dtype=torch.bool)
    padded_empty[:n_r, :n_c] = states == EMPTY
    padded_full[:n_r, :n_c] = states == FULL
    empty = padded_empty.view(big_r, rows, big_c, cols).all(dim=3).all(dim=1)
    full = padded_full.view(big_r, rows, big_c, cols).all(dim=3).all(dim=1)
    return states_from(empty, full)
