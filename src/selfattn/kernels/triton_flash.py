"""The Triton backend's launches and autograd (the kernels are in ``triton_kernels``, what they
visit and how they mask in ``triton_tables``): ``triton_attention`` is what ``flash_with_offset``
calls when the backend is Triton. Forward: one ``forward_kernel`` launch, a program per (row
block, batch x head). Backward: D = rowsum(dO * O) here, then ``dkdv_kernel`` (a program per
key block and key/value head) and ``dq_kernel`` (a program per row block and head).
"""

from __future__ import annotations

import contextlib
import math

import torch
import triton

from selfattn.errors import OptionError
from selfattn.kernels import triton_kernels as tk
from selfattn.kernels.backend import block_size_error
from selfattn.kernels.flash_tiles import log_tile, logging_tiles
from selfattn.kernels.triton_tables import MaskArgs, Plan, alibi_rows, lead_offsets


def default_blocks(d_head: int, dtype: torch.dtype, device: torch.device) -> tuple[tuple[int, int], tuple[int, int]]:
    """((block_q, block_k) of the forward, of the backward). Not tuned on a GPU (none was lent to
    measure with): the common FlashAttention-2 choices, smaller where the tiles (float32's take
    twice the bytes, large heads more) must still fit in shared memory with two pipeline stages.
    Under the interpreter (CPU) 64 x 64: fewer, larger numpy steps."""
    if device.type != "cuda":
        return (64, 64), (64, 64)
    width = d_head * (2 if dtype == torch.float32 else 1)  # a row's bytes, in units of a float16 row of 128
    if width <= 128:
        return (128, 64), (64, 64)
    if width <= 256:
        return (64, 64), (32, 32)
    return (32, 32), (16, 16)


def _shared_args(plan: Plan, args: MaskArgs, q, k):
    """The arguments every kernel takes after its own: the mask, ALiBi, then the sizes."""
    q_len, kv_len = q.shape[-2], k.shape[-2]
    heads, kv_heads = q.shape[-3], k.shape[-3]
    filler = args.lead  # an unused pointer argument
    bias = filler if args.bias is None else args.bias
    bias_offsets = filler if args.bias_offsets is None else args.bias_offsets
    alibi = (filler, filler, filler) if plan.slopes is None else (plan.slopes, plan.q_pos, plan.k_pos)
    docs = (filler, filler) if args.docs is None else args.docs
    return (args.lead, args.table, args.table_leads, *args.band, bias, bias_offsets, *args.bias_strides, *alibi, *docs,
            q_len, kv_len, heads, kv_heads, plan.group)


def _constants(plan: Plan, args: MaskArgs, q, v, blocks, count: bool) -> dict:
    d, d_v = q.shape[-1], v.shape[-1]
    block_d, block_dv = (max(16, triton.next_power_of_2(n)) for n in (d, d_v))
    return dict(BLOCK_M=blocks[0], BLOCK_N=blocks[1], BLOCK_D=block_d, BLOCK_DV=block_dv, MASK=args.kind,
                SOFTCAP=bool(plan.softcap), ALIBI=plan.slopes is not None,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32", COUNT=count,
                num_warps=4 if max(block_d, block_dv) <= 64 else 8, num_stages=2)


def on_device(t: torch.Tensor):
    """Launches on t's GPU (Triton launches on the current one), nothing to do on the CPU."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _visits(count: bool, shape: tuple[int, ...], filler: torch.Tensor) -> torch.Tensor:
    """Where the kernels mark the tiles they visit (count_tiles is recording), else an unused pointer."""
    return torch.zeros(shape, dtype=torch.int32, device=filler.device) if count else filler


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
    visits = _visits(count, (tables.n_rows, tables.n_cols), tables.kv_count)
    with on_device(q):
        tk.forward_kernel[(tables.n_rows, programs)](
            q, k, v, out, lse, lead_offsets(q), lead_offsets(k), lead_offsets(v), lead_offsets(out),
            q.stride(-2), q.stride(-1), k.stride(-2), k.stride(-1), v.stride(-2), v.stride(-1), out.stride(-2),
            tables.kv_count, tables.kv_index, tables.kv_slot, visits,
            *_shared_args(plan, args, q, k), tables.n_cols, q.shape[-1], d_v, plan.scale, plan.softcap or 1.0,
            **_constants(plan, args, q, v, plan.forward_blocks, count),
        )
    if count:
        _log_visits("forward", visits.cpu(), plan.forward_blocks)
    return out, lse


def run_backward(grad_out, q, k, v, out, lse, plan: Plan, bias_grad: bool):
    """dQ, dK, dV (and dS for a float mask) by ``dkdv_kernel`` and ``dq_kernel``."""
    q_len, kv_len = q.shape[-2], k.shape[-2]
    nothing = not q.numel() or not k.numel()  # then no kernel runs, and the gradients are zeros
    dq, dk, dv = ((torch.zeros if nothing else torch.empty)(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dbias = torch.zeros(plan.float_mask.shape if bias_grad else (1,), dtype=torch.float32, device=q.device)
    # the float mask's gradient as the kernels address it: (..., q_len, kv_len), broadcast axes of stride 0
    dbias_view = dbias.expand(*q.shape[:-2], q_len, kv_len) if bias_grad else dbias.view(1, 1, 1)
    dbias_at = (dbias_view, lead_offsets(dbias_view), dbias_view.stride(-2), dbias_view.stride(-1))
    if nothing:
        return dq, dk, dv, dbias
    grad_out = grad_out.contiguous()
    delta = (grad_out.float() * out.float()).sum(-1)  # D = rowsum(dO * O): (..., Hq, q_len)
    tables, args = plan.tiles(q, k, plan.backward_blocks)
    count = logging_tiles()
    shared = _shared_args(plan, args, q, k)
    offsets = lead_offsets(q), lead_offsets(k), lead_offsets(v), lead_offsets(grad_out)
    strides = (q.stride(-2), q.stride(-1), k.stride(-2), k.stride(-1), v.stride(-2), v.stride(-1), grad_out.stride(-2))
    constants = _constants(plan, args, q, v, plan.backward_blocks, count)
    visits = [_visits(count, (tables.n_rows, tables.n_cols), tables.kv_count) for _ in range(2)]  # dK/dV's, dQ's
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
