"""The Triton kernels' view of a call (``triton_kernels``): which tiles to visit, how to mask them.

``flash_with_offset`` hands the Triton backend its inputs in the torch kernel's form: leading
axes broadcast, GQA grouped (q has Hk * G heads), the mask as ``tile_mask`` made it (None, a
structured mask, or a ``FloatMask``). From those, once per call (and kept for the next call
with the same mask):

- the mask's block states at the Triton block size (``mask.block_states``, the very
  function the torch kernel's ``visible_tiles`` reads), turned into per-row-block lists
  of key blocks to visit and per-key-block lists of row blocks (``block_tables``);
- how a PARTIAL tile is masked: a causal or window rule by its numbers (BAND), packed
  documents by the document of each query and key (DOCS), a float mask by pointer (BIAS),
  any other structured mask by the bits of its PARTIAL tiles, gathered here with
  ``mask.allowed`` (TABLE);
- where each (batch, head) starts in every tensor (``lead_offsets``), so that broadcast
  and strided inputs are read in place.

The launches and the autograd function are in ``triton_flash``.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch

from selfattn.kernels import triton_kernels as tk
from selfattn.masks.rules import CausalMask, DocumentMask, SlidingWindowMask
from selfattn.masks.states import EMPTY, PARTIAL
from selfattn.masks.structured import AndMask

BAND_FAR = 2**30  # a window side with no limit


@dataclass
class BlockTables:
    """Which tiles the kernels visit.   All int32, on the inputs' device.

    kv_count (n_rows,), kv_index / kv_slot (n_rows, n_cols): row block i visits key blocks
    kv_index[i, :kv_count[i]]; q_count (n_cols,), q_index / q_slot (n_cols, n_rows): the
    same tiles by key block. A slot is -1 for a FULL tile, else the PARTIAL tile's number
    (its place in ``partial``, the (row block, key block) pairs in row order)."""

    kv_count: torch.Tensor
    kv_index: torch.Tensor
    kv_slot: torch.Tensor
    q_count: torch.Tensor
    q_index: torch.Tensor
    q_slot: torch.Tensor
    partial: list[tuple[int, int]]
    n_rows: int
    n_cols: int


def block_tables(mask, q_len: int, kv_len: int, block_q: int, block_k: int, device) -> BlockTables:
    """The tiles to visit, from the mask's block states (EMPTY tiles are left out of every list)."""
    n_rows, n_cols = -(-q_len // block_q), -(-kv_len // block_k)
    if mask is None:
        states = torch.ones((n_rows, n_cols), dtype=torch.int8)  # FULL
    else:
        states = mask.block_states(block_q, block_k, q_len).to(torch.int8).cpu()
    visible = states != EMPTY  # (n_rows, n_cols)
    is_partial = states == PARTIAL
    slots = torch.full(states.shape, -1, dtype=torch.int32)
    slots[is_partial] = torch.arange(int(is_partial.sum()), dtype=torch.int32)

    def lists(seen: torch.Tensor, slot_grid: torch.Tensor):
        order = torch.sort((~seen).to(torch.int8), dim=1, stable=True).indices  # visible blocks first, in order
        return (seen.sum(1).to(torch.int32), order.to(torch.int32), slot_grid.gather(1, order))

    kv = lists(visible, slots)
    by_key = lists(visible.T.contiguous(), slots.T.contiguous())
    partial = [tuple(pair) for pair in is_partial.nonzero().tolist()]
    return BlockTables(*(t.to(device) for t in (*kv, *by_key)), partial, n_rows, n_cols)


def lead_offsets(t: torch.Tensor) -> torch.Tensor:
    """Where each (batch..., head) matrix of t starts, in elements.   (..., n, e) -> int64 (prod(...),)"""
    offsets = torch.zeros(t.shape[:-2], dtype=torch.int64)
    for axis, (size, stride) in enumerate(zip(t.shape[:-2], t.stride()[:-2])):
        shape = [1] * (t.dim() - 2)
        shape[axis] = size
        offsets = offsets + torch.arange(size, dtype=torch.int64).view(shape) * stride
    return offsets.reshape(-1).to(t.device)


@dataclass
class MaskArgs:
    """A PARTIAL tile's mask in the kernels' terms (``tile_scores``): the kind and what it reads."""

    kind: int
    lead: torch.Tensor  # int32 (B H,): which of the mask's own (batch, head) matrices each program reads (TABLE)
    table: torch.Tensor  # uint8 (partial tiles, mask matrices, block_q, block_k) (TABLE)
    table_leads: int
    band: tuple[int, int, int] = (0, BAND_FAR, BAND_FAR)  # diag, left, right (BAND)
    bias: torch.Tensor | None = None  # the float mask, broadcast to (..., q_len, kv_len) (BIAS)
    bias_offsets: torch.Tensor | None = None
    bias_strides: tuple[int, int] = (0, 0)
    docs: tuple[torch.Tensor, torch.Tensor] | None = None  # int32 (q_len,), (kv_len,): each query's and key's document (DOCS)


def mask_args(mask, float_mask, tables: BlockTables, lead: tuple[int, ...], q_len: int, kv_len: int,
              block_q: int, block_k: int, device) -> MaskArgs:
    """How the kernels mask PARTIAL tiles: BAND for a causal or window rule, BIAS for a float
    mask, TABLE (the bits of every PARTIAL tile) for any other structured mask."""
    none = torch.zeros(1, dtype=torch.int32, device=device)
    if mask is None:
        return MaskArgs(tk.NONE, none, none, 1)
    if float_mask is not None:
        bias = float_mask.expand(*lead, q_len, kv_len)  # views: broadcast axes keep stride 0
        return MaskArgs(tk.BIAS, none, none, 1, bias=bias, bias_offsets=lead_offsets(bias),
                        bias_strides=(bias.stride(-2), bias.stride(-1)))
    if isinstance(mask, SlidingWindowMask):  # and CausalMask: the band's numbers are the whole mask
        return MaskArgs(tk.BAND, none, none, 1, band=band_numbers(mask))
    documents = document_parts(mask)
    if documents is not None:  # packed documents (varlen), alone or with one band: compared in the kernel
        document, band = documents
        docs = tuple(ids.to(device=device, dtype=torch.int32) for ids in (document.q_doc, document.kv_doc))
        return MaskArgs(tk.DOCS, none, none, 1, band=band_numbers(band), docs=docs)
    mask_lead = tuple(mask.lead)
    leads = math.prod(mask_lead)
    which = torch.arange(leads, dtype=torch.int32).view(mask_lead).expand(lead).contiguous().view(-1)  # program -> mask matrix
    table = torch.zeros((max(len(tables.partial), 1), leads, block_q, block_k), dtype=torch.uint8, device=device)
    by_row: dict[int, list[int]] = {}
    for i, j in tables.partial:
        by_row.setdefault(i, []).append(j)
    slot = 0
    for i, blocks in by_row.items():  # one call of allowed() per row block: its PARTIAL tiles side by side
        rows = torch.arange(i * block_q, (i + 1) * block_q, device=device).clamp(max=q_len - 1)
        cols = torch.cat([torch.arange(j * block_k, (j + 1) * block_k, device=device) for j in blocks]).clamp(max=kv_len - 1)
        bits = mask.allowed(rows, cols).to(device)  # (*mask lead, block_q or 1, tiles x block_k)
        bits = bits.expand(*mask_lead, block_q, len(cols)).reshape(leads, block_q, len(blocks), block_k)
        table[slot:slot + len(blocks)] = bits.permute(2, 0, 1, 3)  # (tiles, mask matrices, block_q, block_k)
        slot += len(blocks)
    return MaskArgs(tk.TABLE, which.to(device), table, leads)


def band_numbers(band: SlidingWindowMask | None) -> tuple[int, int, int]:
    """(diag, left, right) of a causal or window rule; None: a band that keeps every pair."""
    if band is None:
        return 0, BAND_FAR, BAND_FAR
    left, right = (min(side, BAND_FAR) for side in band._sides)
    return band.offset, left, right


def document_parts(mask) -> tuple[DocumentMask, SlidingWindowMask | None] | None:
    """(the documents, the band or None) when the mask is a DocumentMask, alone or joined by & with
    one causal or window rule (flash-attn's varlen masks); else None."""
    def parts(m):
        return [p for inner in m.masks for p in parts(inner)] if isinstance(m, AndMask) else [m]

    found = parts(mask)
    documents = [m for m in found if isinstance(m, DocumentMask)]
    bands = [m for m in found if isinstance(m, SlidingWindowMask)]
    if len(documents) != 1 or len(bands) > 1 or len(found) != len(documents) + len(bands):
        return None
    return documents[0], (bands[0] if bands else None)


@dataclass
class Plan:
    """Everything a call's kernels share, worked out once; the tables per block size, when first asked."""

    mask: object
    float_mask: torch.Tensor | None
    scale: float
    softcap: float
    group: int
    forward_blocks: tuple[int, int]
    backward_blocks: tuple[int, int]
    slopes: torch.Tensor | None = None  # ALiBi: float32 (B H, q_len), and the positions
    q_pos: torch.Tensor | None = None
    k_pos: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self._passes: dict = {}

    def tiles(self, q, k, blocks: tuple[int, int]) -> tuple[BlockTables, MaskArgs]:
        if blocks not in self._passes:
            q_len, kv_len, lead = q.shape[-2], k.shape[-2], tuple(q.shape[:-2])

            def make():
                tables = block_tables(self.mask, q_len, kv_len, *blocks, q.device)
                return tables, mask_args(self.mask, self.float_mask, tables, lead, q_len, kv_len, *blocks, q.device)

            if self.float_mask is not None:  # a float mask's numbers may change between calls: read anew
                self._passes[blocks] = make()
            else:
                self._passes[blocks] = kept(self.mask, (blocks, q_len, kv_len, lead, str(q.device)), make)
        return self._passes[blocks]


# The tables of earlier calls. A training loop or a benchmark calls again and again with the same
# mask; making its tables costs a few torch calls and copies to the GPU (a TABLE mask also one
# allowed() per row block), host time the GPU waits for. A causal or window rule and no mask are
# kept by their numbers; any other structured mask by the object itself, for as long as it lives
# (masks are not changed after they are made: their own block states are cached the same way).
_BY_MASK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BY_RULE: dict = {}
RULES_KEPT = 64


def kept(mask, key: tuple, make):
    """make()'s result for this mask and key, made once."""
    if mask is None or type(mask) in (SlidingWindowMask, CausalMask):
        store, key = _BY_RULE, (None if mask is None else (mask.offset, *mask._sides), *key)
    else:
        store = _BY_MASK.setdefault(mask, {})
    if key not in store:
        if store is _BY_RULE and len(store) >= RULES_KEPT:
            store.pop(next(iter(store)))  # the oldest
        store[key] = make()
    return store[key]


def alibi_rows(alibi, lead: tuple[int, ...], q_len: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ALiBi's slope for every (batch, head, row) and the positions it measures distances with.   -> (B H, q_len), (q_len,), (kv_len,)

    alibi: (slopes (S, H), q_pos, k_pos, q_rows): the slope row is the batch element, or
    (packed sequences) q_rows[i], the sequence of query i."""
    slopes, q_pos, k_pos, q_rows = alibi
    batch, heads = math.prod(lead[:-1]), lead[-1]
    if q_rows is None:  # (S, H) with S = batch or 1 -> (batch, H, q_len)
        per_row = slopes.float().expand(batch, heads)[..., None].expand(batch, heads, q_len)
    else:  # (total, H) by each row's sequence -> (1, H, total)
        per_row = slopes.float()[q_rows.to(slopes.device)].T[None].expand(batch, heads, q_len)
    return (per_row.reshape(-1, q_len).contiguous().to(device), q_pos.to(device=device, dtype=torch.int32),
            k_pos.to(device=device, dtype=torch.int32))
