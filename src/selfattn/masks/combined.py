"""Several structured masks as one: ``AndMask`` (every part allows) and ``OrMask`` (any part does).

``a & b`` and ``a | b`` on structured masks (or a structured mask and a bool tensor, wrapped
as ``DenseMask``) build them. Their block states come from the parts' states, and where
those cannot tell (two or more parts PARTIAL on a block) from the tile itself, so the
answer stays exact.
"""

from __future__ import annotations

import functools

import torch

from selfattn.errors import ShapeError
from selfattn.masks.structured import EMPTY, FULL, PARTIAL, StructuredMask, as_structured, states_from


class _Combined(StructuredMask):
    """Several masks on the same grid; ``combine`` joins their bool tiles, ``join`` their block states."""

    def __init__(self, *masks: StructuredMask) -> None:
        self.masks = tuple(as_structured(m) for m in masks)
        kv = {m.kv_len for m in self.masks}
        rows = {m.q_len for m in self.masks} - {None}
        if len(kv) > 1 or len(rows) > 1:
            raise ShapeError(f"masks of different sizes cannot be combined: {[m.shape[-2:] for m in self.masks]}")
        self.kv_len = kv.pop()
        self.q_len = rows.pop() if rows else None
        try:
            self.lead = tuple(torch.broadcast_shapes(*[m.lead for m in self.masks]))
        except RuntimeError:
            raise ShapeError(f"the batch/head axes of the masks do not broadcast: {[m.lead for m in self.masks]}") from None

    def allowed(self, rows, cols):
        return functools.reduce(self.combine, [m.allowed(rows, cols) for m in self.masks])

    def tile(self, rows, cols, device=None):
        return functools.reduce(self.combine, [m.tile(rows, cols, device) for m in self.masks])

    def block_states(self, block_q, block_k, q_len=None):
        q_len = self._rows(q_len)
        stack = torch.stack([m.block_states(block_q, block_k, q_len) for m in self.masks])  # (masks, n_r, n_c)
        states, unsure = self.join(stack)
        for i, j in unsure.nonzero().tolist():  # two or more partial masks: look at the tile itself
            r0, c0 = i * block_q, j * block_k
            tile = self.tile((r0, min(r0 + block_q, q_len)), (c0, min(c0 + block_k, self.kv_len)))
            states[i, j] = EMPTY if not tile.any() else FULL if tile.all() else PARTIAL
        return states


class AndMask(_Combined):
    """Visible where every mask allows: causal & sliding window, documents & causal, padding & anything.

    ``a & b`` builds one. Block states come from the parts' states; where two or more
    parts are PARTIAL the tile itself is looked at, so the answer stays exact.

    Args:
        *masks: structured masks or bool tensors (wrapped as ``DenseMask``) of the same
            q_len (or None) and kv_len, with leading axes that broadcast.

    Raises:
        ShapeError: the masks differ in q_len or kv_len, their leading axes do not
            broadcast, or one is neither a structured mask nor a bool tensor of 2+ axes.
    """

    @staticmethod
    def combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a AND b elementwise: visible where both allow.

        Args:
            a: a bool tile or mask.
            b: a bool tile or mask that broadcasts with a.

        Returns:
            The bool tensor a & b.
        """
        return torch.logical_and(a, b)

    @staticmethod
    def join(stack):
        """The AND of the parts' block states, and where it cannot be told from them.

        Args:
            stack: the parts' block states, int8 (n_masks, n_row_blocks, n_key_blocks).

        Returns:
            The pair (states, unsure) of int8 (n_row_blocks, n_key_blocks), EMPTY if any part is
                EMPTY, FULL if all are FULL, else PARTIAL; and a bool grid that marks the
                blocks (not EMPTY) where two or more parts are PARTIAL.
        """
        empty, full = (stack == EMPTY).any(0), (stack == FULL).all(0)
        return states_from(empty, full), ((stack == PARTIAL).sum(0) >= 2) & ~empty

    def apply(self, scores, rows, cols):
        """scores = -inf where any part hides, in place; a part that allows the whole tile is left out,
        and when one part is left, its own (cached) masking runs.

        Args:
            scores: the tile's scores, (..., r1 - r0, c1 - c0).
            rows: the tile's rows (r0, r1).
            cols: the tile's keys (c0, c1).

        Returns:
            scores, masked.
        """
        return self._by_parts("apply", scores, rows, cols)

    def zero_hidden(self, values, rows, cols):
        """values = 0 where any part hides, in place, leaving out the parts that allow the whole tile.

        Args:
            values: the tile's values, (..., r1 - r0, c1 - c0).
            rows: the tile's rows (r0, r1).
            cols: the tile's keys (c0, c1).

        Returns:
            values, with the hidden pairs zeroed.
        """
        return self._by_parts("zero_hidden", values, rows, cols)

    def _by_parts(self, method: str, tensor, rows, cols):
        """``method`` of the one part that does not cover the tile, nothing if none is left, else of the AND."""
        parts = [m for m in self.masks if not m.covers(rows, cols)]
        if len(parts) > 1:
            return getattr(super(), method)(tensor, rows, cols)
        return getattr(parts[0], method)(tensor, rows, cols) if parts else tensor


class OrMask(_Combined):
    """Visible where any mask allows (e.g. a window plus a few global tokens).

    ``a | b`` builds one; block states are found as for ``AndMask``, exactly.

    Args:
        *masks: structured masks or bool tensors, as for ``AndMask``.

    Raises:
        ShapeError: the masks do not fit together (as for ``AndMask``).
    """

    @staticmethod
    def combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a OR b elementwise: visible where either allows.

        Args:
            a: a bool tile or mask.
            b: a bool tile or mask that broadcasts with a.

        Returns:
            The bool tensor a | b.
        """
        return torch.logical_or(a, b)

    @staticmethod
    def join(stack):
        """The OR of the parts' block states, and where it cannot be told from them.

        Args:
            stack: the parts' block states, int8 (n_masks, n_row_blocks, n_key_blocks).

        Returns:
            The pair (states, unsure) of int8 (n_row_blocks, n_key_blocks), EMPTY if all parts are
                EMPTY, FULL if any is FULL, else PARTIAL; and a bool grid that marks the
                blocks (not FULL) where two or more parts are PARTIAL.
        """
        empty, full = (stack == EMPTY).all(0), (stack == FULL).any(0)
        return states_from(empty, full), ((stack == PARTIAL).sum(0) >= 2) & ~full
