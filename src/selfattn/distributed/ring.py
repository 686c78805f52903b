"""Ring attention: exact attention over a sequence split across P ranks (Liu et al., 2023).

Each rank holds the queries, keys and values of its own positions, (..., N/P, d). The
key/value shards travel around the ring, one hop per step; after P steps every rank has
seen every shard and its queries have attended to the whole sequence:

    step s:  post: send the K/V shard I hold to rank+1, receive the next one from rank-1
             compute: (O_s, lse_s) = flash attention of my queries on the shard I hold
             merge:  (O, lse) <- exact log-sum-exp merge of (O, lse) and (O_s, lse_s)
             wait for the transfer

The transfer is posted before the compute, so the two overlap. No rank ever holds more
than two K/V shards: activations are O(N/P) per rank. The merge runs in float32 or
better (``merge_partial_attention``).

Backward: every rank keeps its queries, O, lse and dO. K/V go around the ring again,
followed by their gradient accumulators: at each step a rank adds what its queries
contribute to dK/dV of the shard it holds (FlashAttention-2's backward with the global
lse, so P = exp(S - lse) are the true probabilities), then passes the accumulator on with
the shard's next hop; after P hops it is back at its owner, complete. dQ never leaves.

Causal: positions are global. A pair (query piece, key piece) is skipped when every key
is in every query's future, computed without a mask when every key is in the past, and
with the causal rule as an offset otherwise (the kernel then skips blocks inside it).
With ``load_balance`` the shards are zigzagged (``sharding.py``) so each rank has the
same work.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from selfattn.checks import check_attention_inputs
from selfattn.distributed.comm import Ring
from selfattn.distributed.sharding import layout_name, shard_lengths, shard_positions
from selfattn.errors import DistributedError, SelfAttnError, ShapeError
from selfattn.kernels.flash import BACKWARD_BLOCK_Q, DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q
from selfattn.kernels.flash_backward import flash_backward
from selfattn.kernels.flash_tiles import flash_forward
from selfattn.kernels.online_softmax import NEG_INF, merge_partial_attention
from selfattn.masks.rules import causal_rule


def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    group=None,
    is_causal: bool = False,
    scale: float | None = None,
    load_balance: bool = True,
) -> torch.Tensor:
    """softmax(scale Q K^T [+ causal]) V over the whole sequence, from this rank's shard.   (..., n, d), (..., n, d), (..., n, d_v) -> (..., n, d_v)

    Call it on every rank of ``group`` (default: the whole world) with shards made by
    ``shard_sequence(x, load_balance=...)``; the same ``load_balance`` must be given here,
    it says which global positions each rank holds. Ranks may hold different numbers of
    positions as long as they follow that split. Differentiable in query, key and value;
    the gradients equal those of single-process attention on the full sequence, and the
    backward, too, must run on every rank.

    Each rank holds the queries, keys and values of the same positions (its shard); the
    key/value shards pass once around the ring (twice with the backward), so no rank ever
    holds more than two of them. Before anything is sent the ranks compare their inputs:
    a wrong input on one rank, or ranks that disagree, end every rank with the same error.

    Args:
        query: (..., n, d) this rank's queries, floating point; n, this rank's number of
            positions, may differ between ranks as the layout's split does.
        key: (..., n, d) the keys of the same positions, same leading axes and dtype
            (shared key/value heads must be repeated first: no GQA, no broadcasting).
        value: (..., n, d_v) the values of the same positions.
        group: the torch.distributed process group to run on; None: the default (whole
            world) group. torch.distributed must be initialised.
        is_causal: a causal mask over the global positions: position i sees j <= i.
        scale: factor applied to Q K^T; None means 1 / sqrt(d).
        load_balance: the layout of the shards: True, zigzag (rank r holds chunks r and
            2P-1-r of 2P, which evens out the causal work); False, contiguous. It must
            match the shards; every rank must give the same value.

    Returns:
        (..., n, d_v) this rank's rows of the attention output over the whole sequence,
            in the query's dtype and in the shard's order (``gather_sequence`` or
            ``unshard_sequence`` put the rows together).

    Raises:
        DistributedError: torch.distributed is not initialised, or this process is not
            in ``group``; any rank's inputs are wrong (not floating-point tensors of at
            least 2 dimensions, differing dtypes or sizes, query and key leading axes
            that differ, an empty shard, a non-bool is_causal or load_balance, a scale
            that is not a finite number) or the ranks disagree on the batch/head axes, d,
            d_v, dtype, device type, is_causal, load_balance, scale or whether gradients
            are wanted, which every rank raises alike; or a transfer fails (another rank
            stopped, or the process group timed out).
        ShapeError: is_causal=True and the ranks' lengths are not the layout's split of
            their total (shards not made by ``shard_sequence`` with this load_balance).

    Examples:
        Under ``torchrun --nproc_per_node=4 script.py``, in script.py:

            import torch
            import torch.distributed as dist
            from selfattn.distributed import gather_sequence, ring_attention, shard_sequence

            dist.init_process_group("gloo")  # "nccl" on GPUs
            torch.manual_seed(0)  # the same full tensors on every rank
            q, k, v = (torch.randn(1, 8, 4096, 64) for _ in range(3))  # (batch, heads, seq, d)
            q, k, v = (shard_sequence(t).requires_grad_() for t in (q, k, v))  # (1, 8, 1024, 64) per rank
            out = ring_attention(q, k, v, is_causal=True)  # (1, 8, 1024, 64): this rank's rows
            out.sum().backward()  # dQ, dK, dV of this rank's shard
            full = gather_sequence(out)  # (1, 8, 4096, 64) on every rank, for checking
            dist.destroy_process_group()
    """
    ring = Ring(group)
    local_problem = _local_problem(query, key, value, is_causal, scale, load_balance)
    mine = {"problem": local_problem}
    if local_problem is None:
        mine.update(_metadata(query, key, value, is_causal, scale, load_balance))
    everyone = ring.agree(mine)  # every rank learns of every problem: all of them stop, none waits
    _check_agreement(everyone, ring.rank)
    plan = RingPlan([m["length"] for m in everyone], is_causal, load_balance)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return _RingAttention.apply(query, key, value, ring, plan, scale)


class RingPlan:
    """Which pieces of a query shard meet which pieces of a key shard, and how.

    ``pairs(rank, src)`` lists (query rows, key rows, causal offset) for rank ``rank``'s
    queries against rank ``src``'s keys: rows and keys are local slices; the offset says
    row i sees key j when j <= i + offset (None: every key visible).
    """

    def __init__(self, lengths: list[int], is_causal: bool, load_balance: bool) -> None:
        self.lengths = lengths
        self.is_causal = is_causal
        world_size, seq_len = len(lengths), sum(lengths)
        if not is_causal:  # without a mask the order of positions does not matter: one piece each
            self.pieces = [[(0, 0, n)] for n in lengths]
            return
        expected = shard_lengths(seq_len, world_size, load_balance)
        if lengths != expected:
            raise ShapeError(
                f"causal ring attention: the ranks hold {lengths} positions, but a {layout_name(load_balance)} split of {seq_len} "
                f"positions over {world_size} ranks gives {expected}; make the shards with "
                f"selfattn.distributed.shard_sequence(x, load_balance={load_balance})"
            )
        self.pieces = []  # per rank: (global start, local start, length) of each piece it holds
        for rank in range(world_size):
            local, pieces = 0, []
            for start, end in shard_positions(seq_len, rank, world_size, load_balance):
                if end > start:
                    pieces.append((start, local, end - start))
                local += end - start
            self.pieces.append(pieces)

    @staticmethod
    def mask(rows: slice, keys: slice, offset: int | None):
        """The kernel's mask for a pair: the causal rule at this offset, or None."""
        return None if offset is None else causal_rule(rows.stop - rows.start, keys.stop - keys.start, offset)

    def pairs(self, rank: int, src: int) -> list[tuple[slice, slice, int | None]]:
        found = []
        for q_start, q_local, q_len in self.pieces[rank]:
            for k_start, k_local, k_len in self.pieces[src]:
                offset = q_start - k_start if self.is_causal else None  # global row q_start + i sees key k_start + j <= it
                if offset is not None and offset + q_len - 1 < 0:
                    continue  # every key is after every query: nothing to compute
                if offset is not None and offset >= k_len - 1:
                    offset = None  # every key is at or before every query: no mask
                found.append((slice(q_local, q_local + q_len), slice(k_local, k_local + k_len), offset))
        return found


def ring_forward(q, k, v, ring: Ring, plan: RingPlan, scale: float):
    """The forward ring.   -> O (..., n, d_v) in q's dtype, lse (..., n) in float32 or better"""
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    output = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=acc_dtype, device=q.device)
    lse = torch.full(q.shape[:-1], NEG_INF, dtype=acc_dtype, device=q.device)
    k_cur, v_cur = k, v
    for step in range(ring.size):
        last = step == ring.size - 1
        transfer = None if last else ring.shift([k_cur, v_cur], plan.lengths[ring.source(step + 1)], "a key/value shard")
        for rows, keys, offset in plan.pairs(ring.rank, ring.source(step)):
            part, part_lse = flash_forward(
                q[..., rows, :], k_cur[..., keys, :], v_cur[..., keys, :], plan.mask(rows, keys, offset), scale,
                DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K,
            )
            _, lse[..., rows] = merge_partial_attention(  # updates this slice of output in place
                output[..., rows, :], lse[..., rows], part.to(acc_dtype), part_lse.to(acc_dtype)
            )
        if transfer is not None:
            k_cur, v_cur = transfer.wait()
    return output.to(q.dtype), lse


def ring_backward(grad_out, q, k, v, output, lse, ring: Ring, plan: RingPlan, scale: float):
    """The backward ring.   -> dQ, dK, dV, each like its input"""
    acc_dtype = lse.dtype
    dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    k_cur, v_cur = k, v
    arriving = None  # the dK/dV accumulator of the shard held now, on its way from rank-1
    for step in range(ring.size):
        last = step == ring.size - 1
        transfer = None if last else ring.shift([k_cur, v_cur], plan.lengths[ring.source(step + 1)], "a key/value shard")
        dk = torch.zeros(k_cur.shape, dtype=acc_dtype, device=q.device)
        dv = torch.zeros(v_cur.shape, dtype=acc_dtype, device=q.device)
        for rows, keys, offset in plan.pairs(ring.rank, ring.source(step)):
            flash_backward(  # adds into the slices of dq, dk, dv
                grad_out[..., rows, :], q[..., rows, :], k_cur[..., keys, :], v_cur[..., keys, :],
                output[..., rows, :], lse[..., rows], plan.mask(rows, keys, offset), scale, BACKWARD_BLOCK_Q, DEFAULT_BLOCK_K,
                grads=(dq[..., rows, :], dk[..., keys, :], dv[..., keys, :]),
            )
        if arriving is not None:  # waited for only now: the transfer ran while this step computed
            dk_before, dv_before = arriving.wait()
            dk += dk_before
            dv += dv_before
        # The accumulator follows its shard to rank+1; after the last step that hop takes it home.
        arriving = ring.shift([dk, dv], plan.lengths[ring.source(step + 1)], "key/value gradients")
        if transfer is not None:
            k_cur, v_cur = transfer.wait()
    dk, dv = arriving.wait()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """Saves this rank's q, k, v, O and lse; the backward runs its own ring (no autograd collectives)."""

    @staticmethod
    def forward(ctx, q, k, v, ring, plan, scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # sent as they are: point-to-point needs contiguous memory
        output, lse = ring_forward(q, k, v, ring, plan, scale)
        ctx.save_for_backward(q, k, v, output, lse)
        ctx.settings = (ring, plan, scale)
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, output, lse = ctx.saved_tensors
        ring, plan, scale = ctx.settings
        dq, dk, dv = ring_backward(grad_out.contiguous(), q, k, v, output, lse, ring, plan, scale)
        return dq, dk, dv, None, None, None


def _local_problem(query, key, value, is_causal, scale, load_balance) -> str | None:
    """What is wrong with this rank's own inputs, or None. Reported to every rank, not raised here."""
    try:
        check_attention_inputs(query, key, value, None, 0.0, False, False)
    except SelfAttnError as error:
        return str(error)
    if query.shape[:-1] != key.shape[:-1]:
        return (
            f"query {tuple(query.shape)} and key {tuple(key.shape)} must hold the same positions of the same "
            "batch and heads (..., n, d); repeat shared key/value heads before ring attention"
        )
    for name, flag in (("is_causal", is_causal), ("load_balance", load_balance)):
        if not isinstance(flag, bool):
            return f"{name} must be True or False, got {flag!r}"
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale)):
        return f"scale must be a finite number or None, got {scale!r}"
    if query.shape[-2] == 0:
        return "the shard is empty: every rank needs at least one position"
    return None


def _metadata(query, key, value, is_causal, scale, load_balance) -> dict:
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return {
        "length": query.shape[-2],
        "batch and heads": tuple(query.shape[:-2]),
        "query/key size d": query.shape[-1],
        "value size d_v": value.shape[-1],
        "dtype": str(query.dtype),
        "device type": query.device.type,
        "is_causal": is_causal,
        "load_balance": load_balance,
        "scale": scale,
        "gradients": wants_grad,
    }


def _check_agreement(everyone: list[dict], rank: int) -> None:
    """Raise the same error on every rank when one rank's inputs are wrong or the ranks disagree."""
    for other, seen in enumerate(everyone):
        if seen["problem"] is not None:
            whose = "this rank's inputs" if other == rank else f"the inputs of rank {other}"
            raise DistributedError(f"ring attention: {whose}: {seen['problem']}")
    first = everyone[0]
    for field in first:
        if field in ("problem", "length"):
            continue
        for other, seen in enumerate(everyone[1:], start=1):
            if seen[field] != first[field]:
                raise DistributedError(
                    f"ring attention: the ranks disagree on {field}: rank 0 has {first[field]!r}, "
                    f"rank {other} has {seen[field]!r} (rank {rank} reporting)"
                )
