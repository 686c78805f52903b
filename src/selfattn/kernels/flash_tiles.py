"""The tile loops of flash attention: the forward over (row block, key block) tiles, and what both passes share.

Inputs arrive grouped for GQA: q (..., Hk * G, q_len, d) with G query heads sharing each
of the Hk key/value heads, k (..., Hk, kv_len, d), v (..., Hk, kv_len, d_v). A row block
takes the same rows of the G heads of a group and stacks them, (..., Hk, G * bq, d), so
one product with the shared K tile serves the whole group: K and V are never repeated,
and dK, dV sum over the group in the same product. G = 1 is plain multi-head attention.
The backward's loop is in ``flash_backward``.

``mask`` is None or an object with ``block_states(bq, bk, q_len)`` (EMPTY / FULL /
PARTIAL per tile, ``selfattn.masks``) and ``apply(scores, rows, cols)``: EMPTY tiles are
never computed, FULL tiles get no mask, PARTIAL tiles get their part of the mask.
"""

from __future__ import annotations

import contextlib
import math
import threading

import torch

from selfattn.kernels.online_softmax import (
    NEG_INF,
    exp_flush_tiny_,
    online_softmax_finish,
    online_softmax_start,
    online_softmax_update,
    online_sum_update,
)
from selfattn.kernels.workers import run_units
from selfattn.masks.dense_states import DenseStates
from selfattn.masks.states import EMPTY, PARTIAL, mask_slice

# exp overflows float32 at 88.7 and float64 at 709.8; a margin of 8 leaves room for the
# row sums (up to kv_len terms, checked separately) and keeps exp(-bound) a normal number.
EXP_MARGIN = 8.0

_tile_log: list | None = None  # (pass, row start, key start) of every tile computed, inside count_tiles()


@contextlib.contextmanager
def count_tiles():
    """Record every tile the kernel computes: ``with count_tiles() as tiles: ...``.   -> [(pass, row start, key start)]

    For tests and explanations: it shows which tiles a mask lets the kernel skip. Every
    tile that ``flash_attention`` (and ring attention, which runs the same tile loops)
    computes inside the ``with`` block, forward and backward, is appended to the list. The
    Triton kernel (``backend="triton"``) marks the tiles its programs visit, read back after
    each launch: its backward appears twice per tile (the dK/dV kernel and the dQ kernel).
    A nested ``count_tiles`` records into its own list only and the outer one resumes
    when it ends. The list is module-wide state: do not count in two threads at once.

    Yields:
        The list being filled, one tuple (pass, row start, key start) per tile in the
            order computed: pass is "forward" or "backward", row start the first query row
            of the tile (the backward's row blocks are at most 128 rows) and key start its
            first key.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> from selfattn.kernels.flash_tiles import count_tiles
        >>> q = torch.randn(1, 2, 6, 4)  # (batch, heads, seq, d)
        >>> with count_tiles() as tiles:
        ...     _ = sa.flash_attention(q, q, q, is_causal=True, block_q=2, block_k=2)
        >>> len(tiles)  # of the 3 x 3 tiles, the 3 above the diagonal are never computed
        6
        >>> tiles[:3]
        [('forward', 0, 0), ('forward', 2, 0), ('forward', 2, 2)]
    """
    global _tile_log
    outer, _tile_log = _tile_log, []
    try:
        yield _tile_log
    finally:
        _tile_log = outer


def log_tile(kind: str, row: int, col: int) -> None:
    if _tile_log is not None:
        _tile_log.append((kind, row, col))


def logging_tiles() -> bool:
    """Whether ``count_tiles`` is recording: then the loops run in one thread, in order."""
    return _tile_log is not None


def visible_tiles(mask, q_len: int, kv_len: int, block_q: int, block_k: int) -> list[list[tuple[int, int, bool]]]:
    """Per row block: the key blocks to compute, as (start, end, partial).   EMPTY blocks are left out."""
    n_cols = -(-kv_len // block_k)
    if mask is None:
        row = [(c, min(c + block_k, kv_len), False) for c in range(0, kv_len, block_k)]
        return [row for _ in range(0, q_len, block_q)]
    states = mask.block_states(block_q, block_k, q_len).tolist()
    return [
        [(j * block_k, min((j + 1) * block_k, kv_len), s == PARTIAL) for j, s in zip(range(n_cols), row) if s != EMPTY]
        for row in states
    ]


def group_rows(x: torch.Tensor, rows: tuple[int, int], group: int) -> torch.Tensor:
    """Rows [r0, r1) of every head of each group, stacked.   (..., Hk * G, n, e) -> (..., Hk, G * (r1 - r0), e)"""
    block = x[..., rows[0]:rows[1], :]
    if group == 1:
        return block
    return block.unflatten(-3, (-1, group)).flatten(-3, -2)  # (..., Hk, G, bq, e) -> (..., Hk, G * bq, e)


def ungroup_rows(x: torch.Tensor, group: int) -> torch.Tensor:
    """The inverse of ``group_rows`` for one block.   (..., Hk, G * bq, e) -> (..., Hk * G, bq, e)"""
    return x if group == 1 else x.unflatten(-2, (group, -1)).flatten(-4, -3)


def score_tile(q_scaled, key, mask, rows: tuple[int, int], cols: tuple[int, int], partial: bool, group: int = 1,
               out: TileBuffer | None = None, score_mod=None, softcap: float = 0.0) -> torch.Tensor:
    """S = scale Q_i K_j^T, -inf where a PARTIAL tile's mask hides.   q_scaled (..., Hk, G * bq, d) -> (..., Hk, G * bq, bk)

    For the online softmax with a running max (and the explainer). The bounded forward and
    the backward keep hidden scores finite and zero them after exp (``mask.zero_hidden``):
    on CPU torch's exp of -inf (or of anything below about -87) takes a slow path, ~25x
    slower than for ordinary numbers (measured: 18 ms against 0.7 ms for 2M floats).
    A fresh tensor, or a view of ``out``'s memory (valid until the next tile). With a
    softcap c > 0, q_scaled carries scale / c and the tile becomes c tanh(Q K^T scale / c).
    """
    keys_t = key[..., cols[0]:cols[1], :].transpose(-2, -1)  # (..., Hk, d, bk)
    if out is None:
        scores = q_scaled @ keys_t
    else:
        shape = (*torch.broadcast_shapes(q_scaled.shape[:-2], keys_t.shape[:-2]), q_scaled.shape[-2], cols[1] - cols[0])
        scores = torch.matmul(q_scaled, keys_t, out=out.get(shape, q_scaled))
    if softcap:
        scores.tanh_().mul_(softcap)
    if score_mod is not None:  # before the mask, as FlexAttention: a score_mod never sees a hidden pair's -inf
        heads = ungroup_rows(scores, group)  # (..., Hq, bq, bk): a view of the scores
        modded = score_mod(heads, rows, cols)
        if group == 1 and modded.shape == scores.shape and modded.is_contiguous() and modded.data_ptr() != heads.data_ptr():
            scores = modded  # a new tensor in the tile's own layout: used as it is, one copy fewer
        else:
            heads.copy_(modded)
    if partial:
        mask.apply(ungroup_rows(scores, group), rows, cols)  # the mask sees (..., Hq, bq, bk): a view of the scores
    return scores


class TileBuffer:
    """One block of memory reused for every score tile of a call: a fresh multi-megabyte
    tile per step costs page faults, which showed up as a large part of the matmul time."""

    def __init__(self) -> None:
        self.flat: torch.Tensor | None = None

    def get(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        size = math.prod(shape)
        if self.flat is None or self.flat.numel() < size or self.flat.dtype != like.dtype:
            self.flat = torch.empty(size, dtype=like.dtype, device=like.device)
        return self.flat[:size].view(shape)


def flash_forward(q, k, v, mask, scale: float, block_q: int, block_k: int, group: int = 1, bounded: bool | None = None,
                  score_mod=None, dropout=None, softcap: float = 0.0, lse_low: bool = False):
    """The tiled forward pass.   -> O (..., Hq, q_len, d_v), lse (..., Hq, q_len) [, lse_low (..., Hq, q_len)]

    When every score is provably small enough for exp (``exp_is_bounded``), the running
    max is not needed and each tile is folded with ``online_sum_update`` (two passes over
    the tile fewer); otherwise with the full online softmax. Both are exact.
    score_mod: None, or ``score_mod(scores, rows, cols)`` -> the modified (..., Hq, bq, bk)
    tile (``kernels.flex``), applied to every tile before the mask; its scores have no
    known bound, so it takes the online softmax.
    dropout: None, or a ``kernels.tile_dropout.TileDropout``: each tile's weights times
    Z / (1 - p) on their way into acc, after their sum went into l (lse is the full softmax's).
    softcap: c > 0 turns every score s into c tanh(s / c) before score_mod and the mask
    (flash-attn's softcap); then |s| <= c, which can make the scores bounded.
    lse_low: also return what float32 rounding cut off lse (``lse_remainder``), for the backward.
    """
    q_len, kv_len, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    output = q.new_empty((*q.shape[:-1], d_v))
    lse = q.new_empty(q.shape[:-1])
    low = q.new_zeros(q.shape[:-1]) if lse_low else None
    if score_mod is not None:
        bounded = False
    elif bounded is None:
        bounded = exp_is_bounded(q, k, scale, mask, softcap)
    keys_t = k.transpose(-2, -1)  # (..., Hk, d, kv_len): a view, sliced per key block
    lead = torch.broadcast_shapes(q.shape[:-3] + (k.shape[-3],) if q.dim() >= 3 else (), k.shape[:-2])
    buffers = threading.local()  # one score tile's memory per thread

    def row_block(unit) -> None:
        (r0, r1), tiles = unit
        buffer = getattr(buffers, "tile", None)
        if buffer is None:
            buffer = buffers.tile = TileBuffer()
        q_scaled = group_rows(q, (r0, r1), group) * query_factor(scale, softcap)  # (..., Hk, G * bq, d)
        state = online_softmax_start(q_scaled.shape[:-1], d_v, q)
        if not bounded:
            for c0, c1, partial in tiles:
                log_tile("forward", r0, c0)
                scores = score_tile(q_scaled, k, mask, (r0, r1), (c0, c1), partial, group, out=buffer, score_mod=score_mod,
                                    softcap=softcap)
                drop = _dropper(dropout, group, (r0, r1), (c0, c1))
                state = online_softmax_update(state, scores, v[..., c0:c1, :], drop).state
        else:  # the common case, kept lean: a few torch calls per tile
            state = state._replace(m=torch.zeros_like(state.m))
            for c0, c1, partial in tiles:
                log_tile("forward", r0, c0)
                scores = torch.matmul(q_scaled, keys_t[..., c0:c1], out=buffer.get((*lead, q_scaled.shape[-2], c1 - c0), q))
                if softcap:
                    scores.tanh_().mul_(softcap)
                added = partial and getattr(mask, "additive", False)  # a float mask: added, -inf and all
                if added:
                    mask.apply(ungroup_rows(scores, group), (r0, r1), (c0, c1))
                weights = exp_flush_tiny_(scores) if added and mask.hides else scores.exp_()  # (..., Hk, G * bq, bk)
                if partial and not added:
                    mask.zero_hidden(ungroup_rows(weights, group), (r0, r1), (c0, c1))
                state = online_sum_update(state, weights, v[..., c0:c1, :], _dropper(dropout, group, (r0, r1), (c0, c1)))
        out_block, lse_block = online_softmax_finish(state)  # (..., Hk, G * bq, d_v), (..., Hk, G * bq)
        output[..., r0:r1, :] = ungroup_rows(out_block, group)
        lse[..., r0:r1] = ungroup_rows(lse_block[..., None], group)[..., 0]
        if low is not None:
            low[..., r0:r1] = ungroup_rows(lse_remainder(state, lse_block)[..., None], group)[..., 0]

    units = list(zip(block_spans(q_len, block_q), visible_tiles(mask, q_len, kv_len, block_q, block_k)))
    run_units(units, row_block, cost=lambda unit: len(unit[1]),  # shared out, the rows with most tiles go first
              sequential=logging_tiles() or dropout is not None)  # a dropout's generator is shared state
    return (output, lse) if low is None else (output, lse, low)


def query_factor(scale: float, softcap: float = 0.0) -> float:
    """What q is multiplied by before the product Q K^T: scale, or scale / c with a softcap c
    (the tile is then c tanh(Q K^T scale / c)). The forward and the backward both take it from
    here, so that the backward's scores round exactly as the forward's did."""
    return scale / softcap if softcap else scale


def lse_remainder(state, lse: torch.Tensor) -> torch.Tensor:
    """(m + log l) - lse, computed in float64: the part of the row's log-sum-exp that lse's own
    rounding lost.   state's m, l (..., rows, 1), lse (..., rows) -> (..., rows); 0 where l = 0

    The backward's P = exp(S - lse) subtracts two numbers of the scores' size, so lse's
    rounding, an ulp of |S|, is an error in every P of the row: with softcap 50 (|S| up to
    50), 4 ulps of 50. lse + this remainder is m + log l to float64's precision; the backward
    folds exp(-remainder) into its rows of dO (``flash_backward``'s lse_low).
    """
    exact = state.m[..., 0].double() + state.l[..., 0].double().log()  # (..., rows)
    return torch.where(state.l[..., 0] > 0, exact - lse.double(), 0.0).to(lse.dtype)


def _dropper(dropout, group: int, rows: tuple[int, int], cols: tuple[int, int]):
    """None, or the function that drops a grouped weight tile's entries in place (``online_sum_update``'s drop)."""
    if dropout is None:
        return None

    def drop(weights: torch.Tensor) -> torch.Tensor:
        ungroup_rows(weights, group).mul_(dropout.multiplier(rows, cols, weights.dtype))  # (..., Hq, bq, bk): a view of weights
        return weights

    return drop


def score_bound(q: torch.Tensor, k: torch.Tensor, scale: float, mask, softcap: float = 0.0) -> float:
    """B with |s| <= B for every finite score s = scale q.k (+ mask).   q, k non-empty

    Cauchy-Schwarz: |scale q_i . k_j| <= |scale| max_i |q_i| max_j |k_j|; a softcap c
    keeps it within c. A bool or structured mask adds only -inf; a float mask adds its own
    largest finite magnitude.
    """
    bound = abs(scale) * float(torch.linalg.vector_norm(q, dim=-1).amax()) * float(torch.linalg.vector_norm(k, dim=-1).amax())
    if softcap:
        bound = min(bound, softcap)
    bias = getattr(mask, "largest_bias", None)
    return bound + bias() if bias is not None else bound


def exp_is_bounded(q: torch.Tensor, k: torch.Tensor, scale: float, mask, softcap: float = 0.0) -> bool:
    """Whether every finite score s satisfies |s| + log(kv_len) < log(max float) - 8: then exp
    of any score, and any row sum, stays a normal finite number (``score_bound``)."""
    if not q.numel() or not k.numel():
        return False
    return score_bound(q, k, scale, mask, softcap) + math.log(k.shape[-2]) < math.log(torch.finfo(q.dtype).max) - EXP_MARGIN


class FloatMask:
    """A float mask (added to the scores) for the tile loops: EMPTY where a tile is all -inf,
    FULL where it is all 0 (nothing to add), else its tile is added.

    Its block states come from one reduction of the tensor (``masks.dense_states``). A
    mask with -inf in it (``hides``) is added as it is, -inf included, and the exp that
    follows is ``exp_flush_tiny_``, which clamps -inf to a normal exponent before exp (on
    the CPU exp(-inf) takes a slow path) and sets the result to exactly 0: one add instead
    of replacing -inf by 0, adding, and zeroing after exp.
    """

    additive = True

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask
        self._states = DenseStates(mask)

    @property
    def extent(self) -> tuple[float, float]:
        """(min, max) of the mask's entries (``DenseStates.extent``)."""
        return self._states.extent()

    @property
    def hides(self) -> bool:
        """Whether some entry is -inf."""
        return self.extent[0] == NEG_INF

    def block_states(self, block_q: int, block_k: int, q_len: int | None = None) -> torch.Tensor:
        rows = self.mask.shape[-2] if self.mask.shape[-2] > 1 else (q_len or 1)
        return self._states.states(block_q, block_k, rows)

    def apply(self, scores: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
        return scores.add_(mask_slice(self.mask, rows, cols).to(scores.dtype))

    def largest_bias(self) -> float:
        """max |b| over the finite entries.

        From the mask's min and max; for a mask with -inf in it, from its finite entries where
        the block summary finds them without another pass (``DenseStates.finite_extent``: a
        causal or window float mask, whose -inf and finite entries meet only along an edge).
        Otherwise infinite, and the mask takes the online softmax.
        """
        low, high = self.extent
        if low != NEG_INF:
            return max(abs(low), abs(high))
        finite = self._states.finite_extent()
        return float("inf") if finite is None else max(abs(finite[0]), abs(finite[1]))


def block_spans(length: int, block: int) -> list[tuple[int, int]]:
    return [(start, min(start + block, length)) for start in range(0, length, block)]
