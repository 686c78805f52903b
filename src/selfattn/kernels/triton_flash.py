"""The host side of the Triton kernels (``triton_kernels``): block tables, launches, autograd.

``flash_with_offset`` comes here when the backend is Triton, with the inputs already in the
torch kernel's form: leading axes broadcast, GQA grouped (q has Hk * G heads), the mask as
``tile_mask`` made it (None, a structured mask, or a ``FloatMask``). What the kernels need
is worked out once per call:

- the mask's block states at the Triton block size (``mask.block_states``, the very
  function the torch kernel's ``visible_tiles`` reads), turned into per-row-block lists
  of key blocks to visit and per-key-block lists of row blocks (``block_tables``);
- how a PARTIAL tile is masked: a causal or window rule by its numbers (BAND), a float
  mask by pointer (BIAS), any other structured mask by the bits of its PARTIAL tiles,
  gathered here with ``mask.allowed`` (TABLE);
- where each (batch, head) starts in every tensor (``lead_offsets``), so that broadcast
  and strided inputs are read in place.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass

import torch

from selfattn.errors import OptionError
from selfattn.kernels import triton_kernels as tk
from selfattn.kernels.backend import block_size_error
from selfattn.kernels.flash_tiles import log_tile, logging_tiles
from selfattn.masks.rules import CausalMask, SlidingWindowMask
from selfattn.masks.states import EMPTY, PARTIAL

BAND_FAR = 2**30  # a window side with no limit


def default_blocks(head_dim: int, dtype: torch.dtype, device: torch.device) -> tuple[tuple[int, int], tuple[int, int]]:
    """((block_q, block_k) of the forward, of the backward). Not tuned on a GPU (none was lent to
    measure with): the common FlashAttention-2 choices, smaller where the tiles (float32's take
    twice the bytes, large heads more) must still fit in shared memory with two pipeline stages.
    Under the interpreter (CPU) 64 x 64: fewer, larger numpy steps."""
    if device.type != "cuda":
        return (64, 64), (64, 64)
    width = head_dim * (2 if dtype == torch.float32 else 1)  # a row's bytes, in units of a float16 row of 128
    if width <= 128:
        return (128, 64), (64, 64)
    if width <= 256:
        return (64, 64), (32, 32)
    return (32, 32), (16, 16)


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


def flat_lead(t: torch.Tensor) -> torch.Tensor:
    """t's (batch..., head) axes as one.   (..., n, e) -> (B H, n, e)"""
    return t.reshape(-1, *t.shape[-2:])


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
        left, right = (min(side, BAND_FAR) for side in mask._sides)
        return MaskArgs(tk.BAND, none, none, 1, band=(mask.offset, left, right))
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


def _shared_args(plan: Plan, args: MaskArgs, q, k, v):
    """The arguments every kernel takes after its own: the mask, ALiBi, then the sizes."""
    q_len, kv_len = q.shape[-2], k.shape[-2]
    heads, kv_heads = q.shape[-3], k.shape[-3]
    filler = args.lead  # an unused pointer argument
    bias = filler if args.bias is None else args.bias
    bias_offsets = filler if args.bias_offsets is None else args.bias_offsets
    alibi = (filler, filler, filler) if plan.slopes is None else (plan.slopes, plan.q_pos, plan.k_pos)
    return (args.lead, args.table, args.table_leads, *args.band, bias, bias_offsets, *args.bias_strides, *alibi,
            q_len, kv_len, heads, kv_heads, plan.group)


def _constants(plan: Plan, args: MaskArgs, q, v, blocks, count: bool) -> dict:
    d, d_v = q.shape[-1], v.shape[-1]
    block_d, block_dv = (max(16, triton_next_pow2(n)) for n in (d, d_v))
    return dict(BLOCK_M=blocks[0], BLOCK_N=blocks[1], BLOCK_D=block_d, BLOCK_DV=block_dv, MASK=args.kind,
                SOFTCAP=bool(plan.softcap), ALIBI=plan.slopes is not None,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32", COUNT=count,
                num_warps=4 if max(block_d, block_dv) <= 64 else 8, num_stages=2)


def on_device(t: torch.Tensor):
    """Launches on t's GPU (Triton launches on the current one), nothing to do on the CPU."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _log_visits(kind: str, visits: torch.Tensor, blocks: tuple[int, int]) -> None:
    for i, j in visits.nonzero().tolist():  # row order, as the torch kernel's forward
        log_tile(kind, i * blocks[0], j * blocks[1])


def run_forward(q, k, v, plan: Plan):
    """O and lse (float32) by ``forward_kernel``, one program per (row block, batch x head)."""
    d_v = v.shape[-1]
    out = torch.empty((*q.shape[:-1], d_v), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    programs = math.prod(q.shape[:-2])
    if not out.numel() and not lse.numel():
        return out, lse
    tables, args = plan.tiles(q, k, plan.forward_blocks)
    count = logging_tiles()
    visits = torch.zeros((tables.n_rows, tables.n_cols), dtype=torch.int32, device=q.device)
    with on_device(q):
        tk.forward_kernel[(tables.n_rows, programs)](
            q, k, v, out, lse, lead_offsets(q), lead_offsets(k), lead_offsets(v), lead_offsets(out),
            q.stride(-2), q.stride(-1), k.stride(-2), k.stride(-1), v.stride(-2), v.stride(-1), out.stride(-2),
            tables.kv_count, tables.kv_index, tables.kv_slot, visits,
            *_shared_args(plan, args, q, k, v), tables.n_cols, q.shape[-1], d_v, plan.scale, plan.softcap or 1.0,
            **_constants(plan, args, q, v, plan.forward_blocks, count),
        )
    if count:
        _log_visits("forward", visits.cpu(), plan.forward_blocks)
    return out, lse


def run_backward(grad_out, q, k, v, out, lse, plan: Plan, bias_grad: bool):
    """dQ, dK, dV (and dS for a float mask) by ``dkdv_kernel`` and ``dq_kernel``."""
    q_len, kv_len = q.shape[-2], k.shape[-2]
    dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    dbias = torch.zeros(plan.float_mask.shape if bias_grad else (1,), dtype=torch.float32, device=q.device)
    # the float mask's gradient as the kernels address it: (..., q_len, kv_len), broadcast axes of stride 0
    dbias_view = dbias.expand(*q.shape[:-2], q_len, kv_len) if bias_grad else dbias.view(1, 1, 1)
    dbias_at = (dbias_view, lead_offsets(dbias_view), dbias_view.stride(-2), dbias_view.stride(-1))
    if not q.numel() or not k.numel():
        return dq, dk, dv, dbias
    grad_out = grad_out.contiguous()
    delta = (grad_out.float() * out.float()).sum(-1)  # D = rowsum(dO * O): (..., Hq, q_len)
    tables, args = plan.tiles(q, k, plan.backward_blocks)
    count = logging_tiles()
    shared = _shared_args(plan, args, q, k, v)
    offsets = lead_offsets(q), lead_offsets(k), lead_offsets(v), lead_offsets(grad_out)
    strides = (q.stride(-2), q.stride(-1), k.stride(-2), k.stride(-1), v.stride(-2), v.stride(-1), grad_out.stride(-2))
    constants = _constants(plan, args, q, v, plan.backward_blocks, count)
    visits = torch.zeros((2, tables.n_rows, tables.n_cols), dtype=torch.int32, device=q.device)
    with on_device(q):
        tk.dkdv_kernel[(tables.n_cols, math.prod(k.shape[:-2]))](
            q, k, v, grad_out, lse, delta, dk, dv, *offsets, *strides,
            tables.q_count, tables.q_index, tables.q_slot, visits[0], *shared,
            tables.n_rows, tables.n_cols, q.shape[-1], v.shape[-1], plan.scale, plan.softcap or 1.0, **constants,
        )
        tk.dq_kernel[(tables.n_rows, math.prod(q.shape[:-2]))](
            q, k, v, grad_out, lse, delta, dq, *dbias_at, *offsets, *strides,
            tables.kv_count, tables.kv_index, tables.kv_slot, visits[1], *shared,
            tables.n_cols, q.shape[-1], v.shape[-1], plan.scale, plan.softcap or 1.0, BIAS_GRAD=bias_grad, **constants,
        )
    if count:  # each tile twice: once for dK and dV, once for dQ
        _log_visits("backward", visits[0].cpu(), plan.backward_blocks)
        _log_visits("backward", visits[1].cpu(), plan.backward_blocks)
    return dq, dk, dv, dbias


class TritonFlash(torch.autograd.Function):
    """Saves Q, K, V, O and lse (float32) only; the backward recomputes every tile, as the torch kernel's."""

    @staticmethod
    def forward(ctx, q, k, v, float_mask, plan):
        out, lse = run_forward(q, k, v, plan)
        ctx.save_for_backward(q, k, v, out, lse, float_mask)
        ctx.plan = plan
        lse_out = lse.to(q.dtype)
        ctx.mark_non_differentiable(lse_out)
        return out, lse_out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse, float_mask = ctx.saved_tensors
        bias_grad = float_mask is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = run_backward(grad_out, q, k, v, out, lse, ctx.plan, bias_grad)
        mask_grad = dbias.to(float_mask.dtype) if bias_grad else None
        return dq, dk, dv, mask_grad, None


def triton_attention(q, k, v, mask, float_mask, scale: float, group: int, softcap: float = 0.0, alibi=None,
                     block_q: int | None = None, block_k: int | None = None):
    """The Triton backend of ``flash_with_offset``: (O, lse), differentiable in q, k, v and a float mask.

    q (..., Hk * G, q_len, d), k and v (..., Hk, kv_len, .) as the torch kernel takes them;
    alibi: None or (slopes (S, H), q_pos (q_len,), k_pos (kv_len,), q_rows (q_len,) or None)."""
    problem = block_size_error(block_q, block_k)
    if problem:
        raise OptionError(problem)
    if not q.is_cuda and not tk.INTERPRETED:
        raise OptionError("the Triton kernels were made for the GPU (TRITON_INTERPRET was not set when they were "
                          "first imported): CPU tensors cannot run them")
    forward, backward = default_blocks(max(q.shape[-1], v.shape[-1]), q.dtype, q.device)
    if block_q is not None or block_k is not None:
        forward = (block_q or forward[0], block_k or forward[1])
        backward = (min(forward[0], 128), forward[1])  # the torch kernel's backward rows, at most 128
    plan = Plan(mask, float_mask, float(scale), float(softcap), group, forward, backward)
    if alibi is not None:
        plan.slopes, plan.q_pos, plan.k_pos = alibi_rows(alibi, tuple(q.shape[:-2]), q.shape[-2], q.device)
    return TritonFlash.apply(q, k, v, float_mask, plan)
