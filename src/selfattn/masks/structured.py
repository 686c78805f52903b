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

import torch

from selfattn.errors import OptionError, ShapeError

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
        from selfattn.masks.combined import AndMask  # below this module: it builds on StructuredMask

        return AndMask(self, as_structured(other))

    def __or__(self, other: StructuredMask) -> StructuredMask:
        from selfattn.masks.combined import OrMask

        return OrMask(self, as_structured(other))

    __rand__ = __and__
    __ror__ = __or__

    def _rows(self, q_len: int | None) -> int:
        rows = self.q_len if self.q_len is not None else q_len
        if rows is None:
            raise OptionError("this mask is the same for every query row: give q_len to split its rows into blocks")
        return rows


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
            from selfattn.masks.dense_states import DenseStates

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
