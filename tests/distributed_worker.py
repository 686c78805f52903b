"""One rank of the distributed tests:  python tests/distributed_worker.py SCENARIO [options]

``distributed_harness.launch`` starts it P times with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in the environment. It joins a gloo process group, runs one scenario and
prints one JSON object per line on stdout; the tests judge them. An exception that
escapes a scenario is printed as {"kind": "error", ...} and the process exits with
status 3, so a test can check the error of every rank.

Correctness is judged against float64 ``F.scaled_dot_product_attention`` on the full
sequence, computed by every rank from the same seed; a rank compares only the rows it
holds, found with ``torch.tensor_split`` (the near-equal rule written independently of
``selfattn.distributed.sharding``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from selfattn.distributed import gather_sequence, ring_attention, shard_sequence

ERROR_EXIT = 3


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


@dataclass(frozen=True)
class Case:
    """One ring attention call, run on every rank of a group."""

    name: str
    n: int  # full sequence length
    lead: tuple = (2, 3)  # batch, heads
    d: int = 8
    d_v: int = 8
    dtype: str = "float64"
    causal: bool = False
    load_balance: bool = True
    scale: float | None = None
    lengths: tuple | None = None  # a contiguous split with these lengths instead of shard_sequence
    grads: str = "qkv"  # inputs that require grad; "" runs the forward under no_grad
    gather: bool = False  # also check gather_sequence of the output and gradients
    expect_error: str | None = None  # the error type every rank must raise


def correctness_cases(world: int) -> list[Case]:
    """The cases of the ``correctness`` scenario for ``world`` ranks (the tests parametrise over them)."""
    n = 13 if world == 1 else 37  # 37 over 4 ranks: zigzag chunks 5,5,5,5,5,4,4,4
    cases = []
    for dtype in ("float64", "float32"):
        for causal in (False, True):
            for balance in (True, False):
                layout = "zigzag" if balance else "contiguous"
                name = f"{dtype}-{'causal' if causal else 'full'}-{layout}-n{n}"
                gather = dtype == "float64" and causal
                cases.append(Case(name, n, dtype=dtype, causal=causal, load_balance=balance, gather=gather))
    for balance in (True, False):
        layout = "zigzag" if balance else "contiguous"
        # N = P + 1: some zigzag chunks are empty; N = P: one position per rank
        cases.append(Case(f"causal-{layout}-n{world + 1}", world + 1, causal=True, load_balance=balance))
        cases.append(Case(f"causal-{layout}-n{world}", world, causal=True, load_balance=balance))
        cases.append(Case(f"float32-causal-{layout}-scale2-dv5", n, d_v=5, dtype="float32", causal=True,
                          load_balance=balance, scale=2.0))
    cases += [
        Case("causal-scale0.3-dv12", n, d_v=12, causal=True, scale=0.3),
        Case("full-2d-input", n, lead=()),
        Case("causal-batch1-head1", n, lead=(1, 1), causal=True),
        Case("causal-3d-input-d3", n, lead=(4,), d=3, d_v=2, causal=True, load_balance=False),
        Case("causal-only-query-grad", n, causal=True, grads="q"),
        Case("causal-forward-no-grad", n, causal=True, grads=""),
        Case("float32-causal-zigzag-n300", 300, lead=(1, 2), dtype="float32", causal=True),
    ]
    if world > 1:
        odd = tuple(range(1, world)) + (n - world * (world - 1) // 2,)  # 1, 2, ..., and the rest
        even = [len(part) for part in torch.tensor_split(torch.arange(n), world)]
        off = (even[0] + 2, *even[1:-1], even[-1] - 2)  # neither split: two positions moved to rank 0
        cases += [
            Case("full-any-lengths", n, lengths=odd),
            Case("reject-causal-lengths-off-zigzag", n, causal=True, lengths=off, expect_error="ShapeError"),
            Case("reject-causal-lengths-off-contiguous", n, causal=True, load_balance=False, lengths=off,
                 expect_error="ShapeError"),
            Case("reject-empty-shard", n, lengths=(0, n - world + 2) + (1,) * (world - 2), expect_error="DistributedError"),
            Case("reject-n-below-p", world - 1, expect_error="ShapeError"),
            Case("after-rejections", n, causal=True),  # the group still works after errors on every rank
        ]
    return cases


def held_positions(n: int, rank: int, world: int, case: Case) -> torch.Tensor:
    """The global positions this rank's shard holds, in shard order."""
    if case.lengths is not None:
        start = sum(case.lengths[:rank])
        return torch.arange(start, start + case.lengths[rank])
    if not case.load_balance:
        return torch.tensor_split(torch.arange(n), world)[rank]
    chunks = torch.tensor_split(torch.arange(n), 2 * world)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]])


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual.double() - expected).abs().max().item() if expected.numel() else 0.0


def run_case(case: Case, group=None) -> dict:
    """Ring attention of ``case`` on this rank; max abs errors against float64 SDPA on the full sequence."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    gen = torch.Generator().manual_seed(1234)
    dtype = getattr(torch, case.dtype)
    full = [torch.randn(*case.lead, case.n, size, generator=gen, dtype=torch.float64).to(dtype)
            for size in (case.d, case.d, case.d_v, case.d_v)]  # q, k, v, dO: the same on every rank
    reference = [t.to(torch.float64, copy=True).requires_grad_() for t in full[:3]]
    ref_out = F.scaled_dot_product_attention(*reference, is_causal=case.causal, scale=case.scale)
    ref_out.backward(full[3].double())
    rows = held_positions(case.n, rank, world, case)
    if case.lengths is not None:
        mine = [t[..., rows, :] for t in full]
        sharded_exactly = True
    else:
        mine = [shard_sequence(t, load_balance=case.load_balance, group=group) for t in full]
        sharded_exactly = all(torch.equal(s, t[..., rows, :]) for s, t in zip(mine, full))
    inputs = [t.requires_grad_(name in case.grads and t.is_floating_point()) for name, t in zip("qkv", mine[:3])]
    with torch.set_grad_enabled(bool(case.grads)):
        out = ring_attention(*inputs, group=group, is_causal=case.causal, scale=case.scale,
                             load_balance=case.load_balance)
    if case.grads:
        out.backward(mine[3])
    errors = {"out": max_error(out.detach(), ref_out.detach()[..., rows, :])}
    magnitudes = {"out": ref_out.detach()[..., rows, :].abs().max().item()}
    results = [out.detach()]
    for name, tensor, ref in zip("qkv", inputs, reference):
        if name in case.grads:
            errors[f"d{name}"] = max_error(tensor.grad, ref.grad[..., rows, :])
            magnitudes[f"d{name}"] = ref.grad[..., rows, :].abs().max().item()
            results.append(tensor.grad)
    record = dict(
        errors=errors,
        magnitudes=magnitudes,  # max |reference|, for the relative part of the tolerance
        finite=all(bool(t.isfinite().all()) for t in results),
        dtype=str(out.dtype),
        shape=list(out.shape),
        expected_shape=[*case.lead, len(rows), case.d_v],
        sharded_exactly=sharded_exactly,
        other_grads_none=all(t.grad is None for name, t in zip("qkv", inputs) if name not in case.grads),
    )
    if case.gather:  # the full tensors on every rank, back in sequence order
        record["gathered"] = {
            "out": max_error(gather_sequence(out.detach(), load_balance=case.load_balance), ref_out.detach()),
            **{f"d{name}": max_error(gather_sequence(t.grad, load_balance=case.load_balance), ref.grad)
               for name, t, ref in zip("qkv", inputs, reference)},
        }
    return record


def run_and_report(case: Case, group=None) -> None:
    """Run ``case``; an error it expects is reported, not raised."""
    try:
        record = run_case(case, group)
    except Exception as error:
        if case.expect_error is None:
            raise
        record = dict(error_type=type(error).__name__, message=str(error))
    emit(kind="case", case=case.name, rank=dist.get_rank(), **record)


def correctness(args) -> None:
    world = dist.get_world_size()
    for case in correctness_cases(world):
        run_and_report(case)
    if world == 4:
        subgroups(dist.get_rank())


def subgroups(rank: int) -> None:
    """Two rings at once on one world: ranks {1, 2} and ranks {0, 3}; group ranks are not global ranks."""
    middle, outer = dist.new_group([1, 2]), dist.new_group([0, 3])
    if rank == 0:  # not a member: a clear error, before any communication
        q = torch.zeros(1, 1, 4, 8, dtype=torch.float64)
        try:
            ring_attention(q, q, q, group=middle)
        except Exception as error:
            emit(kind="case", case="non-member", rank=rank, error_type=type(error).__name__, message=str(error))
    if rank in (1, 2):
        run_and_report(Case("subgroup-1-2", 11, causal=True), middle)
    else:
        run_and_report(Case("subgroup-0-3", 11, lead=(1, 2), causal=True, load_balance=False), outer)
    dist.barrier()


MISMATCH_BASE = Case("mismatch", 12)
MISMATCHES = {  # what one rank (rank 1) changes; every rank must stop with a DistributedError
    "heads": dict(lead=(2, 4)),
    "head-dim": dict(d=4),
    "value-dim": dict(d_v=5),
    "dtype": dict(dtype="float32"),
    "is-causal": dict(causal=True),
    "load-balance": dict(load_balance=False),
    "scale": dict(scale=0.5),
    "gradients": dict(grads=""),
    "integer-input": dict(dtype="int64", grads=""),
}


def mismatch(args) -> None:
    """Every mismatch in turn, each on every rank; then a valid call, which must still work."""
    rank = dist.get_rank()
    for name, change in MISMATCHES.items():
        case = replace(MISMATCH_BASE, name=name, expect_error="DistributedError", **(change if rank == 1 else {}))
        run_and_report(case)
    run_and_report(Case("after-mismatches", 12, causal=True))


def failure_inputs() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    full = [torch.randn(1, 2, 24, 8, generator=gen, dtype=torch.float64) for _ in range(3)]
    return [shard_sequence(t).requires_grad_() for t in full]


def die_before(args) -> None:
    """Rank ``--fail-rank`` raises before ring attention; the others call it."""
    if dist.get_rank() == args.fail_rank:
        raise RuntimeError("planned failure before ring attention")
    ring_attention(*failure_inputs(), is_causal=True)


def die_between(args) -> None:
    """Every rank runs the forward; rank ``--fail-rank`` raises before the backward."""
    out = ring_attention(*failure_inputs(), is_causal=True)
    emit(kind="forward done", rank=dist.get_rank())
    if dist.get_rank() == args.fail_rank:
        raise RuntimeError("planned failure between forward and backward")
    out.sum().backward()


def silent(args) -> None:
    """Rank ``--fail-rank`` stays alive but never calls; it leaves once the others have finished."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank != args.fail_rank:
        ring_attention(*failure_inputs(), is_causal=True)
        return
    deadline = time.monotonic() + 4 * args.pg_timeout
    others = [Path(args.done_dir, f"rank{r}") for r in range(world) if r != rank]
    while time.monotonic() < deadline and not all(p.exists() for p in others):
        time.sleep(0.05)
    emit(kind="silent", rank=rank)
    os._exit(0)  # without tearing down a group whose peers are gone


def hang(args) -> None:
    """Never returns: for the harness's own test."""
    while True:
        time.sleep(1)


SCENARIOS = {f.__name__.replace("_", "-"): f for f in (correctness, mismatch, die_before, die_between, silent, hang)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--pg-timeout", type=float, default=60.0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--done-dir", default=None)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=args.pg_timeout),
    )
    dist.barrier()
    started = time.monotonic()
    status = 0
    try:
        SCENARIOS[args.scenario](args)
    except Exception as error:
        traceback.print_exc()  # to stderr, for a failing test's message
        emit(kind="error", rank=rank, error_type=type(error).__name__, message=str(error),
             seconds=time.monotonic() - started)
        status = ERROR_EXIT
    if args.done_dir:
        Path(args.done_dir, f"rank{rank}").touch()
    if status:
        os._exit(status)  # a broken group may block in its teardown
    dist.destroy_process_group()
    emit(kind="done", rank=rank, seconds=time.monotonic() - started)


if __name__ == "__main__":
    main()
