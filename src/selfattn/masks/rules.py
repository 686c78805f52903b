"""The structured masks people train with: causal, sliding window, padding, packed documents.

Each states its rule once (``allowed``) and its block states from the same rule, in
closed form over block boundaries: no q_len x kv_len matrix is ever made.
"""

from __future__ import annotations

import functools

import torch

from selfattn.errors import OptionError, ShapeError
from selfattn.masks.states import NEG_INF, block_bounds, states_from
from selfattn.masks.structured import StructuredMask

ALIGNMENTS = ("top_left", "bottom_right")
"""Where query row i sits on the key axis: top-left pos(i) = i, bottom-right pos(i) = kv_len - q_len + i."""
_FAR = 1 << 60  # "no limit" for a band side, far beyond any length


def alignment_offset(q_len: int, kv_len: int, align: str) -> int:
    """Query i sits at key position i + offset: 0 top-left, kv_len - q_len bottom-right."""
    check_lengths(q_len, kv_len)
    if align not in ALIGNMENTS:
        raise OptionError(f"unknown causal alignment {align!r}: choose top_left or bottom_right")
    return 0 if align == "top_left" else kv_len - q_len


class SlidingWindowMask(StructuredMask):
    """M[i, j] = (pos(i) - left <= j <= pos(i) + right), pos(i) = i + offset.   (q_len, kv_len)

    left = w - 1, right = 0 is the causal window of w keys (Mistral); left = right = w lets
    a query see w keys on each side (Longformer's local attention). None: no limit on that side.

    Args:
        q_len: number of query rows.
        kv_len: number of keys; None means q_len.
        left: how many earlier keys each query sees, an integer >= 0, or None (no limit).
        right: how many later keys each query sees (default 0), or None (no limit).
        align: "top_left" (default, torch's is_causal: offset 0) or "bottom_right" (offset =
            kv_len - q_len: the queries are the newest tokens, as in KV-cached decoding and
            flash-attn). The two differ only when q_len != kv_len.

    Raises:
        OptionError: left or right is not an integer >= 0 or None, or align is unknown.
        ShapeError: q_len or kv_len is not an integer >= 0.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> from selfattn.masks import BLOCK_STATE_NAMES, SlidingWindowMask
        >>> mask = SlidingWindowMask(6, left=1)  # each query sees itself and the key before
        >>> mask.dense()[:3].int().tolist()
        [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0]]
        >>> mask.block_states(2, 2).tolist()  # 2 = PARTIAL, 0 = EMPTY: a kernel skips 4 of 9 blocks
        [[2, 0, 0], [2, 2, 0], [0, 2, 2]]
        >>> [BLOCK_STATE_NAMES[s] for s in mask.block_states(2, 2)[0].tolist()]
        ['partial', 'empty', 'empty']
        >>> SlidingWindowMask(2, 4, left=1).dense().int().tolist()  # top-left: query i at key i
        [[1, 0, 0, 0], [1, 1, 0, 0]]
        >>> SlidingWindowMask(2, 4, left=1, align="bottom_right").dense().int().tolist()  # the 2 newest
        [[0, 1, 1, 0], [0, 0, 1, 1]]
    """

    def __init__(self, q_len: int, kv_len: int | None = None, *, left: int | None, right: int | None = 0,
                 align: str = "top_left") -> None:
        for name, size in (("left", left), ("right", right)):
            if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
                raise OptionError(f"sliding window {name} size must be an integer >= 0, got {size!r}")
        kv_len = q_len if kv_len is None else kv_len
        self.offset = alignment_offset(q_len, kv_len, align)
        self.q_len, self.kv_len, self.left, self.right, self.align = q_len, kv_len, left, right, align

    @property
    def _sides(self) -> tuple[int, int]:
        return (_FAR if self.left is None else self.left), (_FAR if self.right is None else self.right)

    def allowed(self, rows, cols):
        """M[i, j] = (pos(i) - left <= j <= pos(i) + right) for the given rows and keys.

        Args:
            rows: query row indices, int64 (r,).
            cols: key indices, int64 (c,).

        Returns:
            A bool tensor (r, c), True = may attend.
        """
        left, right = self._sides
        pos = (rows + self.offset)[:, None]  # (r, 1)
        return (cols[None, :] >= pos - left) & (cols[None, :] <= pos + right)  # (r, c)

    def block_states(self, block_q, block_k, q_len=None):
        """EMPTY / FULL / PARTIAL per block, in closed form from the band's edges.

        Args:
            block_q: query rows per block.
            block_k: keys per block.
            q_len: ignored: this mask knows its rows.

        Returns:
            int8 (ceil(q_len / block_q), ceil(kv_len / block_k)).
        """
        left, right = self._sides
        r0, r1 = (t[:, None] + self.offset for t in block_bounds(self.q_len, block_q))  # positions of the block's rows
        c0, c1 = (t[None, :] for t in block_bounds(self.kv_len, block_k))
        empty = (c1 - 1 < r0 - left) | (c0 > r1 - 1 + right)  # the keys end before the first window or start after the last
        full = (c0 >= r1 - 1 - left) & (c1 - 1 <= r0 + right)  # every key inside every row's window
        return states_from(empty, full)

    def apply(self, scores, rows, cols):
        """scores += 0 / -inf band bias for the tile, in place.

        Args:
            scores: the tile's scores, (..., r1 - r0, c1 - c0).
            rows: the tile's rows (r0, r1).
            cols: the tile's keys (c0, c1).

        Returns:
            scores, masked.
        """
        # Tiles at the same distance from the diagonal share a pattern: one cached 0/-inf bias each.
        return scores.add_(band_bias(*self._tile_key(rows, cols), scores.dtype, scores.device))

    def zero_hidden(self, values, rows, cols):
        """values *= 0 / 1 band pattern for the tile, in place (``values`` must be finite).

        Args:
            values: the tile's values, (..., r1 - r0, c1 - c0).
            rows: the tile's rows (r0, r1).
            cols: the tile's keys (c0, c1).

        Returns:
            values, with the hidden pairs zeroed.
        """
        return values.mul_(band_keep(*self._tile_key(rows, cols), values.dtype, values.device))

    def _tile_key(self, rows, cols) -> tuple[int, int, int, int, int]:
        left, right = self._sides
        return rows[1] - rows[0], cols[1] - cols[0], rows[0] + self.offset - cols[0], left, right


class CausalMask(SlidingWindowMask):
    """M[i, j] = (j <= pos(i)): no query sees a later key.   (q_len, kv_len); top-left as torch's is_causal.

    A ``SlidingWindowMask`` with no left limit and right = 0.

    Args:
        q_len: number of query rows.
        kv_len: number of keys; None means q_len.
        align: "top_left" (default, pos(i) = i) or "bottom_right" (pos(i) = kv_len - q_len + i:
            the queries are the newest tokens, as in KV-cached decoding and flash-attn).

    Raises:
        OptionError: align is unknown.
        ShapeError: q_len or kv_len is not an integer >= 0.
    """

    def __init__(self, q_len: int, kv_len: int | None = None, *, align: str = "top_left") -> None:
        super().__init__(q_len, kv_len, left=None, right=0, align=align)


@functools.lru_cache(maxsize=64)
def band_hidden(rows: int, cols: int, diagonal: int, left: int, right: int, device) -> torch.Tensor:
    """True where a tile row i must not see key j: j < diagonal + i - left or j > diagonal + i + right.   -> (rows, cols)"""
    pos = torch.arange(rows, device=device)[:, None] + diagonal
    j = torch.arange(cols, device=device)[None, :]
    return (j < pos - left) | (j > pos + right)


@functools.lru_cache(maxsize=64)
def band_keep(rows: int, cols: int, diagonal: int, left: int, right: int, dtype: torch.dtype, device) -> torch.Tensor:
    """1 where the band lets row i see key j, 0 elsewhere.   -> (rows, cols)"""
    return (~band_hidden(rows, cols, diagonal, left, right, device)).to(dtype)


@functools.lru_cache(maxsize=64)
def band_bias(rows: int, cols: int, diagonal: int, left: int, right: int, dtype: torch.dtype, device) -> torch.Tensor:
    """0 where the band lets row i see key j, -inf elsewhere.   -> (rows, cols)"""
    hidden = band_hidden(rows, cols, diagonal, left, right, device)
    return torch.zeros((rows, cols), dtype=dtype, device=device).masked_fill_(hidden, NEG_INF)


class PaddingMask(StructuredMask):
    """M[b, 0, 0, j] = (j < length_b): padded keys are hidden.   (batch, 1, 1, kv_len)

    The same for every query row (q_len is None); lead is (batch, 1).

    Args:
        key_lengths: real keys per batch element, a 1-D sequence or tensor of integers >= 0.
        kv_len: the padded length; None means the longest of key_lengths.
        device: where the lengths tensor is put; None keeps a tensor's device.

    Raises:
        ShapeError: key_lengths is not a 1-D list of integers >= 0, kv_len is not an
            integer >= 0, or a length exceeds kv_len.
    """

    def __init__(self, key_lengths, kv_len: int | None = None, *, device=None) -> None:
        lengths = torch.as_tensor(key_lengths, device=device)
        dtype = lengths.dtype
        if lengths.dim() != 1 or dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise ShapeError(
                f"key_lengths must be a 1-D sequence of integers, got shape {tuple(lengths.shape)} "
                f"of {str(dtype).removeprefix('torch.')}"
            )
        if lengths.numel() and int(lengths.min()) < 0:
            raise ShapeError(f"key lengths must be >= 0, got {lengths.tolist()}")
        longest = int(lengths.max()) if lengths.numel() else 0
        if kv_len is not None:
            check_lengths(longest, kv_len)
        kv_len = longest if kv_len is None else kv_len
        if longest > kv_len:
            raise ShapeError(f"a key length ({longest}) exceeds kv_len ({kv_len})")
        self.lengths, self.q_len, self.kv_len, self.lead = lengths, None, kv_len, (len(lengths), 1)

    def allowed(self, rows, cols):
        """M[b, 0, 0, j] = (j < length_b) for the given keys.

        Args:
            rows: query row indices (r,); unused, every row is the same.
            cols: key indices, int64 (c,).

        Returns:
            A bool tensor (batch, 1, 1, c).
        """
        lengths = self.lengths.to(cols.device)
        return (cols[None, :] < lengths[:, None])[:, None, None, :]  # (batch, 1, 1, c)

    def block_states(self, block_q, block_k, q_len=None):
        """EMPTY / FULL / PARTIAL per block, over all batch elements (from the shortest and longest length).

        Args:
            block_q: query rows per block.
            block_k: keys per block.
            q_len: number of query rows to split, required (this mask does not know it).

        Returns:
            int8 (ceil(q_len / block_q), ceil(kv_len / block_k)).

        Raises:
            OptionError: q_len is None.
        """
        n_rows = len(block_bounds(self._rows(q_len), block_q)[0])
        c0, c1 = block_bounds(self.kv_len, block_k)
        longest = int(self.lengths.max()) if self.lengths.numel() else 0
        shortest = int(self.lengths.min()) if self.lengths.numel() else 0
        empty, full = (c0 >= longest)[None, :], (c1 <= shortest)[None, :]
        return states_from(empty.expand(n_rows, -1), full.expand(n_rows, -1))


class DocumentMask(StructuredMask):
    """Packed sequences: query i sees key j only when both are in the same document.   (q_len, kv_len)

    ``lengths`` are the documents' lengths in order (they tile the sequence); give
    ``kv_lengths`` when the keys of each document differ in number from its queries.
    The block-diagonal mask of flash-attention's varlen calls and xformers' BlockDiagonalMask.

    Args:
        lengths: each document's number of queries, in order; q_len is their sum.
        kv_lengths: each document's number of keys, in the same order; None means lengths.

    Raises:
        ShapeError: lengths or kv_lengths is not a non-empty 1-D list of integers >= 0, or
            the two list different numbers of documents.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> from selfattn.masks import CausalMask, DocumentMask
        >>> mask = DocumentMask([2, 2])
        >>> mask.dense().int().tolist()
        [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
        >>> mask.block_states(2, 2).tolist()  # 1 = FULL, 0 = EMPTY
        [[1, 0], [0, 1]]
        >>> (mask & CausalMask(4)).block_states(2, 2).tolist()  # 2 = PARTIAL
        [[2, 0], [0, 2]]
    """

    def __init__(self, lengths, kv_lengths=None) -> None:
        self.q_lengths = _document_lengths("lengths", lengths)
        self.kv_lengths = self.q_lengths if kv_lengths is None else _document_lengths("kv_lengths", kv_lengths)
        if len(self.kv_lengths) != len(self.q_lengths):
            raise ShapeError(f"lengths and kv_lengths must list the same documents: {len(self.q_lengths)} and {len(self.kv_lengths)}")
        self.q_len, self.kv_len = int(self.q_lengths.sum()), int(self.kv_lengths.sum())
        docs = torch.arange(len(self.q_lengths))
        self.q_doc = torch.repeat_interleave(docs, self.q_lengths)  # (q_len,): the document of each query
        self.kv_doc = torch.repeat_interleave(docs, self.kv_lengths)  # (kv_len,)

    def allowed(self, rows, cols):
        """M[i, j] = (document(i) == document(j)) for the given rows and keys.

        Args:
            rows: query row indices, int64 (r,).
            cols: key indices, int64 (c,).

        Returns:
            A bool tensor (r, c).
        """
        return self.q_doc.to(rows.device)[rows][:, None] == self.kv_doc.to(cols.device)[cols][None, :]

    def covers(self, rows, cols):
        """Whether the tile's rows and keys all lie in one document (documents are contiguous, so the
        first and last of each tell).

        Args:
            rows: the tile's rows (r0, r1).
            cols: the tile's keys (c0, c1).

        Returns:
            True when every pair of the tile is in the same document.
        """
        (r0, r1), (c0, c1) = rows, cols
        if r1 <= r0 or c1 <= c0:
            return False
        q_doc, kv_doc = self.q_doc, self.kv_doc
        return int(q_doc[r0]) == int(q_doc[r1 - 1]) == int(kv_doc[c0]) == int(kv_doc[c1 - 1])

    def block_states(self, block_q, block_k, q_len=None):
        """EMPTY / FULL / PARTIAL per block, from each document's rows and keys per block.

        Args:
            block_q: query rows per block.
            block_k: keys per block.
            q_len: ignored: this mask knows its rows.

        Returns:
            int8 (ceil(q_len / block_q), ceil(kv_len / block_k)).
        """
        # Visible pairs in a block = sum over documents of (its rows in the block) x (its keys in the block).
        docs = len(self.q_lengths)
        rows, keys = _per_block_counts(self.q_doc, block_q, docs), _per_block_counts(self.kv_doc, block_k, docs)  # (n_r, docs), (n_c, docs)
        visible = rows @ keys.T  # (n_r, n_c), exact in float64
        r0, r1 = block_bounds(self.q_len, block_q)
        c0, c1 = block_bounds(self.kv_len, block_k)
        area = ((r1 - r0)[:, None] * (c1 - c0)[None, :]).double()
        return states_from(visible == 0, visible == area)


def _per_block_counts(doc: torch.Tensor, block: int, n_docs: int) -> torch.Tensor:
    """counts[b, d] = positions of document d in block b.   (n,) -> (n_blocks, docs)"""
    counts = torch.zeros((-(-len(doc) // block), n_docs), dtype=torch.float64)
    counts.index_put_((torch.arange(len(doc)) // block, doc), torch.ones(len(doc), dtype=torch.float64), accumulate=True)
    return counts


def _document_lengths(name: str, lengths) -> torch.Tensor:
    try:
        tensor = torch.as_tensor(lengths)
    except (TypeError, ValueError, RuntimeError):
        raise ShapeError(f"{name} must be a list of document lengths (integers >= 0), got {lengths!r}") from None
    if tensor.dim() != 1 or tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise ShapeError(f"{name} must be a 1-D list of document lengths (integers >= 0), got {lengths!r}")
    if not len(tensor) or int(tensor.min()) < 0:
        raise ShapeError(f"{name} must list at least one document, each of length >= 0, got {tensor.tolist()}")
    return tensor.long()


def check_lengths(q_len: int, kv_len: int) -> None:
    for name, size in (("q_len", q_len), ("kv_len", kv_len)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ShapeError(f"{name} must be an integer >= 0, got {size!r}")


def causal_rule(q_len: int, kv_len: int, offset: int) -> CausalMask:
    """The causal mask where query i sees keys j <= i + offset, for any offset (a ring's shard pairs, a cache)."""
    mask = CausalMask(q_len, kv_len)
    mask.offset = offset
    return mask
