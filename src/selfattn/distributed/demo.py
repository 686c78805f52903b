"""Ring attention on P processes, timed, measured and checked against single-process attention.

    torchrun --standalone --nproc_per_node=2 -m selfattn.distributed.demo --seq-len 8192 --causal
    python -m selfattn.distributed.demo --seq-len 4096          # one process: a world of 1

Every rank builds the same full q, k, v and dO from the seed, keeps its shard
(``shard_sequence``) and frees the rest. After a warm-up on a tiny input it times the ring
forward, then forward + backward, with the peak memory of the latter above the shards
(``selfattn.peak_memory``). Rank 0 then runs torch's ``scaled_dot_product_attention`` on
the full inputs, forward and backward, and compares it with the ring's output and
gradients, all-gathered from every rank. Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import socket
import sys
import time

import torch
import torch.nn.functional as F

from selfattn.distributed.demo_report import format_json, format_text
from selfattn.distributed.ring import ring_attention
from selfattn.distributed.sharding import gather_sequence, shard_lengths, shard_sequence
from selfattn.errors import DistributedError, OptionError, SelfAttnError
from selfattn.peak_memory import PeakMemory

PROG = "selfattn.distributed.demo"
EXIT_USAGE, EXIT_DISTRIBUTED = 2, 1
EPILOG = """\
exit status: 0 on success; 2 for a bad option or input (one line on stderr, from rank 0);
1 when the process group fails (a rank stopped, a timeout): each rank that sees it prints
one line. Under torchrun, torchrun itself then exits 1 and adds its own failure report;
the other ranks leave a bad option to rank 0 and exit 0, so that torchrun lets rank 0 say it.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (from rank 0 only) and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(_usage_error(f"{message} (see --help)"))


def _first_rank() -> bool:
    return os.environ.get("RANK", "0").strip() in ("0", "")


def _usage_error(message: str, every_rank: bool = False) -> int:
    """Say a usage error (rank 0 only, unless every_rank) and return this rank's exit status.

    An error that every rank has is said once, by rank 0. torchrun stops every worker as soon
    as one fails, so a rank that failed before rank 0 had printed would silence the only
    message: under torchrun the other ranks therefore exit 0 and torchrun waits for rank 0,
    whose status 2 fails the run; elsewhere they exit 2 too.
    """
    if every_rank or _first_rank():
        print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
        return EXIT_USAGE
    return 0 if "TORCHELASTIC_RUN_ID" in os.environ else EXIT_USAGE


class _ThisRankError(OptionError):
    """An option that fails on this rank only (no GPU for it): every rank with it says so."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0], epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=4096, metavar="N", help="positions in the whole sequence")
    parser.add_argument("--causal", action="store_true", help="causal mask (positions are global)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64, metavar="D")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--no-load-balance", action="store_true", help="contiguous shards instead of zigzag")
    parser.add_argument("--forward-only", action="store_true", help="no backward: time and check the forward")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads per rank (default: cores / local ranks)")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                        help="auto: nccl on CUDA (rank i on cuda:LOCAL_RANK), else gloo on the CPU")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S", help="process-group timeout in seconds")
    parser.add_argument("--json", action="store_true", help="rank 0 prints one JSON object instead of the table")
    parser.add_argument("--no-check", action="store_true", help="skip the comparison with single-process attention")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        place = launch_environment()
        check_options(args, place)
        return run(args, place)
    except DistributedError as error:
        print(f"{PROG}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_DISTRIBUTED
    except SelfAttnError as error:
        return _usage_error(str(error), every_rank=isinstance(error, _ThisRankError))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def launch_environment() -> dict:
    """This process's rank, world size and local place; sets up a world of 1 outside torchrun."""
    env = os.environ
    if "RANK" not in env:  # plain `python -m`: be rank 0 of 1
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                   LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    missing = [name for name in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in env]
    if missing:
        raise OptionError(f"RANK is set but {', '.join(missing)} is not: run under torchrun, or unset RANK")
    try:
        place = {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"])}
        place["local_rank"] = int(env.get("LOCAL_RANK", place["rank"]))
        place["local_world_size"] = int(env.get("LOCAL_WORLD_SIZE", place["world_size"]))
    except ValueError:
        raise OptionError("RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE must be integers") from None
    if not 0 <= place["rank"] < place["world_size"]:
        raise OptionError(f"RANK {place['rank']} is not in a world of WORLD_SIZE {place['world_size']}")
    return place


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_options(args, place: dict) -> None:
    """Reject what cannot run, before any rank waits for another. Sets args.backend and args.threads."""
    world = place["world_size"]
    for name in ("batch", "heads", "head_dim"):
        if getattr(args, name) < 1:
            raise OptionError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.seq_len < 1:
        raise OptionError(f"--seq-len must be at least 1, got {args.seq_len}")
    if args.seq_len < world:
        raise OptionError(f"--seq-len {args.seq_len} is too short for {world} processes: each needs at least one position")
    if not args.timeout > 0:
        raise OptionError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.threads is not None and args.threads < 1:
        raise OptionError(f"--threads must be at least 1, got {args.threads}")
    if args.threads is None:
        args.threads = max(1, cpu_cores() // max(1, place["local_world_size"]))
    if args.backend == "auto":
        args.backend = "nccl" if torch.cuda.is_available() else "gloo"
    if args.backend == "nccl" and not torch.cuda.is_available():
        raise OptionError("--backend nccl needs CUDA, and torch sees no GPU here; use gloo")
    if args.backend == "nccl" and place["local_rank"] >= torch.cuda.device_count():
        raise _ThisRankError(f"rank {place['rank']} (local rank {place['local_rank']}) has no GPU: "
                             f"this machine has {torch.cuda.device_count()}; run at most that many processes per node")


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run(args, place: dict) -> int:
    """The whole demo on this rank; rank 0 prints the report."""
    torch.set_num_threads(args.threads)
    device = torch.device(f"cuda:{place['local_rank']}" if args.backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        torch.distributed.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout),
                                             device_id=device if device.type == "cuda" else None)
    except (RuntimeError, ValueError) as error:
        raise DistributedError(f"rank {place['rank']}: could not start the process group: {error}") from None
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    layout = {"is_causal": args.causal, "load_balance": not args.no_load_balance}
    dtype = getattr(torch, args.dtype)
    warm_up(args, device, dtype, layout)
    mine, gathered = measure(args, device, dtype, layout)
    stats: list = [None] * world
    collective("collecting the timings", torch.distributed.all_gather_object, stats, mine)
    if rank != 0:
        return 0
    diffs = None if args.no_check else reference_diffs(args, device, dtype, gathered)
    summary = {"world_size": world, "backend": args.backend, "device": device.type, "threads_per_rank": args.threads,
               "seq_len": args.seq_len, "lengths": shard_lengths(args.seq_len, world, layout["load_balance"]),
               "layout": "zigzag" if layout["load_balance"] else "contiguous", "batch": args.batch,
               "heads": args.heads, "head_dim": args.head_dim, "dtype": args.dtype, "causal": args.causal,
               "forward_only": args.forward_only, "seed": args.seed, "ranks": stats, "max_diff": diffs}
    print(format_json(summary) if args.json else format_text(summary), flush=True)
    return 0


def measure(args, device, dtype, layout: dict) -> tuple[dict, list[torch.Tensor]]:
    """This rank's timings and peak memory; the full output (and dQ, dK, dV), gathered from every rank."""
    q, k, v, grad_out = (shard_sequence(t, load_balance=layout["load_balance"])
                         for t in full_inputs(args, device, dtype))  # the full tensors are freed here
    mine = {"rank": torch.distributed.get_rank(), "positions": q.shape[-2], "fwd_bwd_s": None}
    backward = not args.forward_only
    peak = PeakMemory(device)  # around the forward + backward, or the forward alone with --forward-only
    with peak if not backward else contextlib.nullcontext():
        mine["forward_s"], out = timed(device, False, ring_attention, q, k, v, **layout)
    if backward:
        del out
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        with peak:
            mine["fwd_bwd_s"], out = timed(device, True, _forward_backward, q, k, v, grad_out, **layout)
    mine.update(peak_bytes=peak.bytes, memory=peak.method or peak.unavailable)
    results = [out.detach()] + ([q.grad, k.grad, v.grad] if backward else [])
    gathered = [collective(f"gathering the {what}", gather_sequence, t, load_balance=layout["load_balance"])
                for what, t in zip(("output", "dQ", "dK", "dV"), results)]
    return mine, gathered


def full_inputs(args, device, dtype) -> list[torch.Tensor]:
    """q, k, v, dO: (batch, heads, N, d) each, the same on every rank (drawn on the CPU from the seed)."""
    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.batch, args.heads, args.seq_len, args.head_dim)
    return [torch.randn(shape, generator=generator, dtype=dtype).to(device) for _ in range(4)]


def warm_up(args, device, dtype, layout: dict) -> None:
    """One tiny ring (forward and backward): connections, thread pools and lazy imports start here."""
    x = torch.randn(1, 1, 16, args.head_dim, dtype=dtype, device=device)  # 16 per rank: a valid split of 16 P
    x.requires_grad_(not args.forward_only)
    out = ring_attention(x, x, x, **layout)
    if x.requires_grad:
        out.sum().backward()


def _forward_backward(q, k, v, grad_out, **layout) -> torch.Tensor:
    out = ring_attention(q, k, v, **layout)
    out.backward(grad_out)
    return out


def timed(device, grad: bool, step, *args, **kwargs):
    """(seconds this rank spent in step(*args, **kwargs), its result); the ranks start together, wait for the last."""
    collective("waiting for the other ranks", torch.distributed.barrier)
    with torch.set_grad_enabled(grad):
        start = time.perf_counter()
        result = step(*args, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    collective("waiting for the other ranks", torch.distributed.barrier)
    return seconds, result


def collective(what: str, call, *args, **kwargs):
    """call(*args, **kwargs), with a process-group failure turned into a DistributedError that says what failed."""
    try:
        return call(*args, **kwargs)
    except RuntimeError as error:
        cause = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise DistributedError(f"rank {torch.distributed.get_rank()}: {what} failed ({cause})") from None


def reference_diffs(args, device, dtype, gathered: list[torch.Tensor]) -> dict:
    """max |ring - torch SDPA| of the output (and dQ, dK, dV), on all of this machine's cores."""
    torch.set_num_threads(cpu_cores())
    q, k, v, grad_out = full_inputs(args, device, dtype)
    backward = not args.forward_only
    q, k, v = (t.requires_grad_(backward) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
    expected = [out.detach()]
    if backward:
        out.backward(grad_out)
        expected += [q.grad, k.grad, v.grad]
    names = ("output", "dQ", "dK", "dV")
    return {name: float((mine - theirs).abs().max()) for name, mine, theirs in zip(names, gathered, expected)}


if __name__ == "__main__":
    sys.exit(main())
