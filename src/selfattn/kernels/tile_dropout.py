"""Attention dropout inside the tiled kernel, regenerated in the backward instead of stored.

    P = softmax(S)                       the full softmax, lse unchanged by dropout
    O = (P * Z / (1 - p)) V              Z_ij ~ Bernoulli(1 - p): keep weight ij

The keep pattern Z is a function of (seed, batch, head, i, j) alone. It is drawn on a fixed
grid of DROP_ROWS x DROP_COLS cells, independent of the tiles: cell (a, b) seeds a
generator from the call's seed and (a, b), draws uniforms for every batch element and
head of the cell, and a tile takes the parts of the cells it overlaps. So the forward
(tiles of up to 512 rows) and the backward (128 rows, its own key blocks) see the same Z,
any block size gives the same result, and Z is never held for the whole matrix. The call's
seed is drawn from torch's generator (or the one given), so ``torch.manual_seed``
reproduces a run.

The backward of FlashAttention-2 with dropout (Dao 2023), per tile:

    dV_j += (P * Z / (1 - p))^T dO_i
    dP    = (dO_i V_j^T) * Z / (1 - p)
    dS    = P * (dP - D_i),   D_i = rowsum(dO_i * O_i)     (still sum_j P_ij dP_ij)
"""

from __future__ import annotations

import torch

from selfattn.errors import OptionError

DROP_ROWS = 64  # half the backward's row blocks: one of its tiles meets two rows of cells
DROP_COLS = 128  # the smallest key block the kernel chooses

_MASK64 = (1 << 64) - 1


def check_dropout(dropout_p) -> float:
    """dropout_p as a float in [0, 1), or an OptionError."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise OptionError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    return float(dropout_p)


class TileDropout:
    """The keep pattern of one attention call: ``multiplier(rows, cols)`` gives Z / (1 - p) for a tile.

    Args:
        p: the chance of dropping each weight, in (0, 1).
        seed: the call's seed (``draw_seed``).
        lead: the leading axes of the scores, (..., Hq): one uniform per batch element,
            head and (i, j).
        device: where the pattern is drawn.
    """

    def __init__(self, p: float, seed: int, lead: tuple[int, ...], device) -> None:
        self.p, self.seed, self.lead, self.device = p, seed, tuple(lead), torch.device(device)
        self.scale = 1.0 / (1.0 - p)
        self._generator = torch.Generator(device=self.device)
        self._cell = None  # (a, b, uniforms) of the last cell drawn: neighbouring tiles often share it

    def multiplier(self, rows: tuple[int, int], cols: tuple[int, int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Z / (1 - p) for rows [r0, r1) and keys [c0, c1), in ``dtype``.   -> (..., Hq, r1 - r0, c1 - c0)

        The uniforms are float32 whatever the dtype, so the pattern is the same in every precision."""
        (r0, r1), (c0, c1) = rows, cols
        tile = torch.empty((*self.lead, r1 - r0, c1 - c0), dtype=torch.float32, device=self.device)
        for a in range(r0 // DROP_ROWS, (r1 - 1) // DROP_ROWS + 1):
            top, bottom = max(r0, a * DROP_ROWS), min(r1, (a + 1) * DROP_ROWS)
            for b in range(c0 // DROP_COLS, (c1 - 1) // DROP_COLS + 1):
                left, right = max(c0, b * DROP_COLS), min(c1, (b + 1) * DROP_COLS)
                uniforms = self._uniforms(a, b)  # (..., Hq, DROP_ROWS, DROP_COLS)
                tile[..., top - r0:bottom - r0, left - c0:right - c0] = uniforms[
                    ..., top - a * DROP_ROWS:bottom - a * DROP_ROWS, left - b * DROP_COLS:right - b * DROP_COLS]
        return tile.ge_(self.p).to(dtype).mul_(self.scale)  # u >= p keeps: P(keep) = 1 - p

    def dense(self, q_len: int, kv_len: int) -> torch.Tensor:
        """The whole keep pattern Z as bool.   -> (..., Hq, q_len, kv_len); for return_attn_probs and tests."""
        if not q_len or not kv_len:
            return torch.ones((*self.lead, q_len, kv_len), dtype=torch.bool, device=self.device)
        return self.multiplier((0, q_len), (0, kv_len)) > 0

    def _uniforms(self, a: int, b: int) -> torch.Tensor:
        if self._cell is not None and self._cell[:2] == (a, b):
            return self._cell[2]
        self._generator.manual_seed(cell_seed(self.seed, a, b))
        uniforms = torch.rand((*self.lead, DROP_ROWS, DROP_COLS), generator=self._generator, device=self.device)
        self._cell = (a, b, uniforms)
        return uniforms


def cell_seed(seed: int, a: int, b: int) -> int:
    """A generator seed for grid cell (a, b) of the call with ``seed``: the three mixed by
    splitmix64's finaliser, so that neighbouring cells and calls get unrelated streams."""
    x = (seed + 0x9E3779B97F4A7C15 * (1 + a) + 0xC2B2AE3D27D4EB4F * (1 + b)) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


def draw_seed(generator: torch.Generator | None, device) -> int:
    """The call's seed, drawn from ``generator`` (None: torch's default generator for the device)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise OptionError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    on = generator.device if generator is not None else torch.device(device)
    return int(torch.randint(0, 1 << 62, (), generator=generator, device=on))


def tile_dropout(dropout_p: float, generator, lead: tuple[int, ...], device) -> TileDropout | None:
    """The call's ``TileDropout``, or None when dropout_p is 0 (nothing drawn, the generator untouched)."""
    p = check_dropout(dropout_p)
    if p == 0.0:
        return None
    return TileDropout(p, draw_seed(generator, device), lead, device)
