"""Masks given by a rule instead of a q_len x kv_len matrix.

A structured mask answers three questions without building the whole matrix:

    allowed(rows, cols)       may query row i attend to key j, for the given positions
    block_states(bq, bk)      for each (row block, key block) of a tiled kernel: EMPTY (no
                              pair visible: skip the block), FULL (every pair visible: no
                              mask needed) or PARTIAL (mask this block only)
    dense()                   the full bool matrix, for drawing and for testing

The masks: ``CausalMask`` and ``SlidingWindowMask`` (a band around each query's
position, either alignment), ``PaddingMask`` (real keys of each batch element),
``DocumentMask`` (packed sequences: a query sees only keys of its own document), a dense
bool tensor wrapped as ``DenseMask``, and any combination with ``&`` (both allow) and
``|`` (either allows). Leading (batch, head) axes broadcast; a block is EMPTY or FULL
only if it is so for every batch element and head, because a kernel computes a tile for
all of them at once. Every answer is exact, which the tests check against the dense form.
"""

from __future__ import annotations

import functools

import torch

from selfattn.errors import OptionError, ShapeError
from selfattn.masks.dense_states import DenseStates
from selfattn.masks.states import EMPTY, FULL, NEG_INF, PARTIAL, mask_slice, states_from


class StructuredMask:
    """A bool mask (True = may attend) of shape (*lead, q_len, kv_len); q_len None: the same for every row.

    The base of every structured mask, not used on its own. A subclass sets the three
    attributes and writes ``allowed`` and ``block_states``; ``dense``, ``tile``, ``apply``
    and ``zero_hidden`` follow from ``allowed`` (subclasses may override them for speed).
    ``a & b`` is an ``AndMask``, ``a | b`` an ``OrMask``; a bool tensor on either side is
    wrapped as a ``DenseMask``.

    Attributes:
        q_len: number of query rows, or None when every row is the same (``PaddingMask``).
        kv_len: number of keys.
        lead: leading (batch, head) axes of the mask, () when it is the same for all.
    """

    q_len: int | None
    kv_len: int
    lead: tuple[int, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the dense form: (*lead, q_len or 1, kv_len)."""
        return (*self.lead, 1 if self.q_len is None else self.q_len, self.kv_len)

    def allowed(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The mask at query positions ``rows`` (r,) and key positions ``cols`` (c,).   -> bool (*lead, r or 1, c)

        Args:
            rows: query row indices, int64 (r,).
            cols: key indices, int64 (c,).

        Returns:
            A bool tensor (*lead, r, c), or (*lead, 1, c) when q_len is None; True = may attend.
        """
        raise NotImplementedError

    def block_states(self, block_q: int, block_k: int, q_len: int | None = None) -> torch.Tensor:
        """EMPTY / FULL / PARTIAL per (row block, key block).   -> int8 (ceil(q_len / bq), ceil(kv_len / bk))

        A block is EMPTY or FULL only if it is so for every batch element and head. The
        last blocks may be shorter when the block sizes do not divide the lengths.

        Args:
            block_q: query rows per block.
            block_k: keys per block.
            q_len: number of query rows to split, needed only when the mask's q_len is None.

        Returns:
            int8 (ceil(q_len / block_q), ceil(kv_len / block_k)) of EMPTY, FULL and PARTIAL.
        """
        raise NotImplementedError

    def dense(self, device=None) -> torch.Tensor:
        """The whole mask as a bool tensor.   -> (*lead, q_len, kv_len)

        Args:
            device: where the tensor is made; None is torch's default device.

        Returns:
            A bool tensor of ``shape`` (q_len axis 1 when q_len is None), True = may attend.
        """
        rows = torch.arange(1 if self.q_len is None else self.q_len, device=device)
        return self.allowed(rows, torch.arange(self.kv_len, device=device))

    def tile(self, rows: tuple[int, int], cols: tuple[int, int], device=None) -> torch.Tensor:
        """The mask on rows [r0, r1) and keys [c0, c1).   -> bool (*lead, r1 - r0 or 1, c1 - c0)

        Args:
            rows: the tile's rows (r0, r1), end excluded.
            cols: the tile's keys (c0, c1), end excluded.
            device: where the tile is made; None is torch's default device.

        Returns:
            A bool tensor (*lead, r1 - r0, c1 - c0), with a row axis of 1 when q_len is None.
        """
        r = torch.arange(*rows, device=device) if self.q_len is not None else torch.zeros(1, dtype=torch.long, device=device)
        return self.allowed(r, torch.arange(*cols, device=device))

    def apply(self, scores: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
        """scores[..., i, j] = -inf where the tile hides (i, j), in place.   scores (..., r1 - r0, c1 - c0)

        Args:
            scores: the tile's scores, (..., r1 - r0, c1 - c0), overwritten.
            rows: the tile's rows (r0, r1).
            cols: the tile's keys (c0, c1).

        Returns:
            scores, masked.
        """
        tile = self.tile(rows, cols, scores.device)
        return scores.masked_fill_(tile.logical_not_(), NEG_INF)

    def zero_hidden(self, values: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
        """values[..., i, j] *= 0 where the tile hides (i, j), in place: after exp, instead of exp(-inf).

        ``values`` must be finite. A multiplication, because on CPU masked_fill_ costs
        about 20x more (measured: 24 ms against 1 ms for 2M floats).

        Args:
            values: the tile's values (e.g. exp of the scores), (..., r1 - r0, c1 - c0), overwritten.
            rows: the tile's rows (r0, r1).
            cols: the tile's keys (c0, c1).

        Returns:
            values, with the hidden pairs set to 0.
        """
        return values.mul_(self.tile(rows, cols, values.device))

    def covers(self, rows: tuple[int, int], cols: tuple[int, int]) -> bool:
        """Whether the mask allows every pair of the tile, when that is cheap to tell; False otherwise.

        Args:
            rows: the tile's rows (r0, r1).
            cols: the tile's keys (c0, c1).

        Returns:
            True only if every (i, j) of the tile may attend; False means "not known to".
        """
        return False

    def check_size(self, q_len: int, kv_len: int) -> None:
        """ShapeError unless this mask fits attention of q_len queries over kv_len keys.

        Args:
            q_len: number of queries of the attention call (any, when the mask's q_len is None).
            kv_len: number of keys of the attention call.

        Raises:
            ShapeError: the lengths differ from the mask's.
        """
        if kv_len != self.kv_len or (self.q_len is not None and q_len != self.q_len):
            raise ShapeError(f"the mask is for q_len x kv_len = {self.shape[-2]} x {self.kv_len}, but the inputs are {q_len} x {kv_len}")

    def __and__(self, other: StructuredMask) -> StructuredMask:
        return AndMask(self, as_structured(other))

    def __or__(self, other: StructuredMask) -> StructuredMask:
        return OrMask(self, as_structured(other))

    __rand__ = __and__
    __ror__ = __or__

    def _rows(self, q_len: int | None) -> int:
        rows = self.q_len if self.q_len is not None else q_len
        if rows is None:
            raise OptionError("this mask is the same for every query row: give q_len to split its rows into blocks")
        return rows


def as_structured(mask) -> StructuredMask:
    """A structured mask as it is; a bool tensor wrapped as a ``DenseMask``."""
    if isinstance(mask, StructuredMask):
        return mask
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() >= 2:
        return DenseMask(mask)
    raise ShapeError(f"masks combine with & and | only with other masks or bool tensors, got {type(mask).__name__}")


class DenseMask(StructuredMask):
    """A bool tensor (*lead, q_len or 1, kv_len) as a structured mask; its block states come from reduction.

    A row axis of 1 means the same for every row (q_len None). Tiles are views of the
    tensor, so they stay on its device.

    Args:
        mask: the bool tensor, True = may attend, at least 2-D (kept, not copied).

    Raises:
        ShapeError: mask is not a bool tensor with at least 2 axes.
    """

    def __init__(self, mask: torch.Tensor) -> None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() < 2:
            raise ShapeError("DenseMask needs a bool tensor with at least 2 dimensions (q_len, kv_len)")
        self.mask = mask
        self.q_len = mask.shape[-2] if mask.shape[-2] > 1 else None
        self.kv_len = mask.shape[-1]
        self.lead = tuple(mask.shape[:-2])
        self._states = None  # a DenseStates, made when first asked: one reduction for every tile size

    def allowed(self, rows, cols):
        """The tensor's entries at the given rows and keys.

        Args:
            rows: query row indices, int64 (r,); unused when q_len is None.
            cols: key indices, int64 (c,).

        Returns:
            A bool tensor (*lead, r or 1, c).
        """
        m = self.mask.to(rows.device)
        m = m if self.q_len is None else m.index_select(-2, rows)
        return m.index_select(-1, cols)

    def tile(self, rows, cols, device=None):
        """The tensor's slice for rows [r0, r1) and keys [c0, c1), a view.

        Args:
            rows: the tile's rows (r0, r1).
            cols: the tile's keys (c0, c1).
            device: unused: the view stays on the tensor's device.

        Returns:
            A bool view (*lead, r1 - r0 or 1, c1 - c0).
        """
        return mask_slice(self.mask, rows, cols)

    def apply(self, scores, rows, cols):
        """scores[..., i, j] = -inf where the tile hides (i, j), in place.

        Args:
            scores: the tile's scores, (..., r1 - r0, c1 - c0).
            rows: the tile's rows (r0, r1).
            cols: the tile's keys (c0, c1).

        Returns:
            scores, masked.
        """
        return scores.masked_fill_(~self.tile(rows, cols), NEG_INF)

    def block_states(self, block_q, block_k, q_len=None):
        """EMPTY / FULL / PARTIAL per block, by reducing the tensor (``states_of_dense``).

        Args:
            block_q: query rows per block.
            block_k: keys per block.
            q_len: number of query rows, needed only when the tensor's row axis is 1.

        Returns:
            int8 (ceil(q_len / block_q), ceil(kv_len / block_k)).

        Raises:
            OptionError: q_len is None and the tensor's row axis is 1.
        """
        if self._states is None:
            self._states = DenseStates(self.mask)
        return self._states.states(block_q, block_k, self._rows(q_len))

    def dense(self, device=None):
        """The wrapped tensor itself (moved when device is given).

        Args:
            device: where to move it; None keeps it where it is.

        Returns:
            The bool tensor (*lead, q_len or 1, kv_len).
        """
        return self.mask if device is None else self.mask.to(device)


# ----------------------------------------------------------------------------- & and |


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
