"""Flash attention, the naive three-line form and our reference against PyTorch's SDPA, in one run.

Implementations (all on the same inputs, float32, CPU):

    sdpa       torch.nn.functional.scaled_dot_product_attention (its CPU flash kernel): the peer
    flash      selfattn.flash_attention: tiled, exact, O(N) memory, custom backward
    naive      softmax(q k^T * scale (+ causal mask)) v in plain torch, as a user would write it
    reference  selfattn.scaled_dot_product_attention: our readable oracle (full score matrix)

Cases: batch 1, 8 heads, head dim 64, N = 1k ... 16k, causal and not, "forward" and
"fwd+bwd". Forward runs on inputs with requires_grad=False (no autograd graph; the
reference then takes its in-place path); fwd+bwd runs on requires_grad=True inputs and
backpropagates a fixed random dO. The implementations are interleaved round by round,
in a rotating order, so load changes hit all alike; we report the median per pass and
its ratio to SDPA in the same run, and check once per case that outputs (and, for
fwd+bwd, dQ, dK, dV) agree with SDPA's (max |diff|).

Peak memory: each (implementation, case) runs once more in a fresh child process, which
reports its peak resident memory minus its resident memory after creating the inputs
(Linux VmHWM, reset through /proc/self/clear_refs; torch's CPU allocator keeps no peak
counter). The naive form and the reference hold (8 x N x N x 4 B) score matrices, 8.6 GB
each at N = 16k: where a computed estimate exceeds the memory budget, they are skipped
and the table says how much they would need (default budget: 60% of the machine's
memory, or what is available less 2 GB if that is smaller).

    .venv/bin/python bench/attention.py --docs        # full run, ~16 min on 2 cores; writes docs/flash-bench.{md,png}
    .venv/bin/python bench/attention.py --impls sdpa,flash,naive      # ~5 min less: without the reference
    .venv/bin/python bench/attention.py --lengths 1024 --rounds 1       # smoke check, ~30 s
    .venv/bin/python bench/attention.py --lengths 4096 --no-memory --impls sdpa,flash,flash:512x512  # tiles
    .venv/bin/python bench/attention.py --masks --markdown docs/mask-bench.md   # windows, documents, GQA: ~5 min
    options: --rounds R (default 5 up to N = 2k, 3 above)  --threads T  --skip-naive-above N
             --memory-budget-gb G  --impls LIST  --no-memory  --markdown PATH  --plot PATH
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from selfattn import causal_bottom_right, flash_attention, scaled_dot_product_attention
from selfattn.peak_memory import PeakMemory

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402
import attention_masks  # noqa: E402
from peers import sdpa_shape  # noqa: E402
from attention_report import print_tables, write_markdown, write_plot  # noqa: E402

BATCH, HEADS, D_HEAD = 1, 8, 64
LENGTHS = (1024, 2048, 4096, 8192, 16384)
IMPLS = ("sdpa", "flash", "naive", "reference")
PASSES = ("forward", "fwd+bwd")
# Peak bytes of the score-matrix implementations, in units of one (B, H, N, N) float32
# matrix, measured with --measure-memory at N = 2k and 4k (rounded up): the naive form
# holds two matrices at once in the forward (q k^T and its scaled copy) and three in the
# backward; the reference works in place without gradients (plus the causal mask) but
# keeps every step for autograd.
SCORE_MATRICES = {("naive", "forward"): 2.1, ("naive", "fwd+bwd"): 3.1,
                  ("reference", "forward"): 1.4, ("reference", "fwd+bwd"): 6.1}
# Older small cases with other masks (kept from the first version of this script).
# (batch, heads, kv_heads, seq, d_head, mask)
MASK_CASES = [(1, 8, 2, 1024, 64, "gqa"), (4, 12, 12, 128, 32, "bool mask"), (1, 8, 8, 1024, 64, "bool mask")]


def naive_attention(q, k, v, is_causal=False):
    """softmax(Q K^T / sqrt(d) + causal mask) V, the three lines everybody writes first."""
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5)  # (B, H, N, d) @ (B, H, d, N) -> (B, H, N, N)
    if is_causal:
        scores = scores.masked_fill(~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(dim=-1) @ v  # (B, H, N, N) @ (B, H, N, d)


def implementation(name: str):
    """fn(q, k, v, **kwargs) for a name; "flash:BQxBK" is flash attention with those tiles."""
    if name.startswith("flash:"):
        block_q, block_k = (int(x) for x in name.removeprefix("flash:").split("x"))
        return lambda q, k, v, **kw: flash_attention(q, k, v, block_q=block_q, block_k=block_k, **kw)
    return {"sdpa": F.scaled_dot_product_attention, "flash": flash_attention,
            "naive": naive_attention, "reference": scaled_dot_product_attention}[name]


@dataclass
class Case:
    n: int
    causal: bool
    pass_: str  # "forward" or "fwd+bwd"
    ms: dict = field(default_factory=dict)  # impl -> median ms
    diff: dict = field(default_factory=dict)  # impl -> max |diff| against sdpa
    skipped: dict = field(default_factory=dict)  # impl -> why
    peak_mb: dict = field(default_factory=dict)  # impl -> peak RSS growth in MB

    @property
    def flops(self) -> float:
        """Useful FLOPs: 2 matmuls of N x N x d forward (half of them causal), 2.5x that backward."""
        pairs = self.n * (self.n + 1) / 2 if self.causal else self.n**2
        forward = 4 * BATCH * HEADS * D_HEAD * pairs
        return forward * (3.5 if self.pass_ == "fwd+bwd" else 1.0)


def score_matrix_bytes(n: int) -> int:
    return BATCH * HEADS * n * n * 4


def needed_bytes(impl: str, n: int, pass_: str) -> int:
    """Estimated peak memory of one call: score matrices for naive/reference, O(N) otherwise."""
    return int(SCORE_MATRICES.get((impl, pass_), 0.0) * score_matrix_bytes(n))


def default_budget_gb() -> float:
    """60% of the machine's memory, or what is available now less 2 GB if that is smaller."""
    info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in open("/proc/meminfo")}
    return min(0.6 * info["MemTotal"], info["MemAvailable"] - 2**31) / 1e9


def skip_reason(impl: str, n: int, pass_: str, args) -> str | None:
    if not impl.startswith(("naive", "reference")):
        return None
    need = needed_bytes(impl, n, pass_) / 1e9
    if args.skip_naive_above is not None and n > args.skip_naive_above:
        return f"skipped (--skip-naive-above {args.skip_naive_above}; needs {need:.1f} GB)"
    if need > args.memory_budget_gb:
        return f"skipped (needs {need:.1f} GB)"
    return None


def make_inputs(n: int, requires_grad: bool, batch=BATCH, heads=HEADS, kv_heads=HEADS, d=D_HEAD):
    """q, k, v (B, H, N, d) and dO (B, H, N, d), the same for every implementation."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, n, d, generator=g)
    k, v = (torch.randn(batch, kv_heads, n, d, generator=g) for _ in range(2))
    grad_out = torch.randn(batch, heads, n, d, generator=g)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)], grad_out


def run_once(fn, qkv, grad_out, kwargs, backward: bool):
    """One call (and backward); returns (seconds, [O, dQ, dK, dV] or [O])."""
    for t in qkv:
        t.grad = None
    start = time.perf_counter()
    out = fn(*qkv, **kwargs)
    if backward:
        out.backward(grad_out)
    seconds = time.perf_counter() - start
    return seconds, [out.detach()] + ([t.grad for t in qkv] if backward else [])


def max_diff(a: list, b: list) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def time_case(case: Case, impls, rounds: int, inputs=None, kwargs=None) -> None:
    """Median ms per implementation, interleaved with a rotating order; diffs from round 1."""
    backward = case.pass_ == "fwd+bwd"
    qkv, grad_out = inputs or make_inputs(case.n, backward)
    kwargs = {"is_causal": True} if case.causal else (kwargs or {})
    active = [i for i in impls if i not in case.skipped]
    times, first = {i: [] for i in active}, {}
    for r in range(rounds):
        for impl in active[r % len(active) :] + active[: r % len(active)]:
            seconds, result = run_once(implementation(impl), qkv, grad_out, kwargs, backward)
            times[impl].append(seconds)
            first.setdefault(impl, result)
            del result
    for impl in active:
        case.ms[impl] = statistics.median(times[impl]) * 1e3
        case.diff[impl] = max_diff(first[impl], first["sdpa"])


def warm_up(impls, passes=PASSES, masks=(False, True), n: int = 256) -> None:
    """One small call of every implementation and pass: thread pools and lazy imports start here."""
    for pass_ in passes:
        qkv, grad_out = make_inputs(n, pass_ == "fwd+bwd")
        for impl in impls:
            for causal in masks:
                run_once(implementation(impl), qkv, grad_out, {"is_causal": causal}, pass_ == "fwd+bwd")


def measure_memory_child(impl: str, n: int, causal: bool, pass_: str) -> None:
    """In a fresh process: peak RSS growth of one call, after inputs exist. Prints JSON."""
    backward = pass_ == "fwd+bwd"
    warm_up([impl], [pass_], [causal], n=128)
    qkv, grad_out = make_inputs(n, backward)
    with PeakMemory("cpu") as peak:  # Linux VmHWM, reset to the current RSS at the start (garbage collected first)
        run_once(implementation(impl), qkv, grad_out, {"is_causal": causal}, backward)
    if peak.bytes is None:
        raise RuntimeError(peak.unavailable)  # the parent's table says "failed"
    print(json.dumps({"peak_bytes": peak.bytes}))


def measure_memory(cases, impls, threads: int, budget_gb: float) -> None:
    """Peak memory of every (case, implementation), each in a fresh child process.

    Children run side by side, one per CPU, while their estimated peaks fit the budget
    together: only their memory is measured, and torch's import alone takes seconds.
    """
    todo = [(c, i) for c in cases for i in impls if i not in c.skipped]
    todo.sort(key=lambda job: -needed_bytes(job[1], job[0].n, job[0].pass_))  # big ones first, alone
    running = []  # (case, impl, process, bytes)
    while todo or running:
        in_use = sum(r[3] for r in running)
        if todo and len(running) < (os.cpu_count() or 1):
            case, impl = todo[0]
            need = needed_bytes(impl, case.n, case.pass_) + 2**29  # + torch itself and the inputs
            if not running or in_use + need <= budget_gb * 1e9:
                todo.pop(0)
                command = [sys.executable, os.path.abspath(__file__), "--threads", str(threads), "--measure-memory",
                           impl, str(case.n), "causal" if case.causal else "none", case.pass_]
                process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                running.append((case, impl, process, need))
                continue
        case, impl, process, _ = running.pop(0)
        stdout, stderr = process.communicate()
        if process.returncode != 0:
            case.peak_mb[impl] = None  # the table says "failed"; the time stays
            print(f"memory child {impl} N={case.n} {case.pass_} failed:\n{stderr[-2000:]}", file=sys.stderr)
            continue
        case.peak_mb[impl] = json.loads(stdout.strip().splitlines()[-1])["peak_bytes"] / 2**20


def mask_cases(rounds: int):
    """The older small cases (GQA, bool masks): flash and reference against sdpa, time only."""
    rows = []
    for batch, heads, kv_heads, seq, d, mask in MASK_CASES:
        if mask == "gqa":
            kwargs = {"enable_gqa": True}
        else:
            noise = torch.rand(seq, seq, generator=torch.Generator().manual_seed(1)) < 0.5
            kwargs = {"attn_mask": sdpa_shape(causal_bottom_right(seq, seq) | noise)}  # (1, 1, N, N) for every side
        for pass_ in PASSES:
            case = Case(seq, False, pass_)
            inputs = make_inputs(seq, pass_ == "fwd+bwd", batch, heads, kv_heads, d)
            time_case(case, ("sdpa", "flash", "reference"), rounds, inputs, kwargs)
            rows.append((f"B{batch} H{heads}/{kv_heads} N{seq} d{d} {mask}", case))
    return rows


def loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=list(LENGTHS))
    parser.add_argument("--rounds", type=int, default=None, help="rounds per case (default 5 up to N=2048, 3 above)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--skip-naive-above", type=int, default=None, metavar="N")
    parser.add_argument("--memory-budget-gb", type=float, default=None)
    parser.add_argument("--impls", type=lambda s: s.split(","), default=list(IMPLS),
                        help="comma-separated, from sdpa,flash,naive,reference and flash:BQxBK (tile sizes)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    parser.add_argument("--markdown", metavar="PATH")
    parser.add_argument("--plot", metavar="PATH")
    parser.add_argument("--docs", action="store_true", help="= --markdown docs/flash-bench.md --plot docs/flash-bench.png")
    parser.add_argument("--measure-memory", nargs=4, metavar=("IMPL", "N", "MASK", "PASS"), help=argparse.SUPPRESS)
    parser.add_argument("--masks", action="store_true",
                        help="instead: structured masks, packed documents and GQA against SDPA (bench/attention_masks.py)")
    parser.add_argument("--long-window-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.long_window_child:
        attention_masks.long_window_child(args.long_window_child)
        return
    if args.masks:
        run_masks(args)
        return
    if args.measure_memory:
        impl, n, mask, pass_ = args.measure_memory
        measure_memory_child(impl, int(n), mask == "causal", pass_)
        return
    if args.docs:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        args.markdown = args.markdown or os.path.join(root, "docs", "flash-bench.md")
        args.plot = args.plot or os.path.join(root, "docs", "flash-bench.png")
    for path in (args.markdown, args.plot):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"no folder for {path}")  # before the run, not after 15 minutes
    if any(n < 1 for n in args.lengths) or (args.rounds is not None and args.rounds < 1):
        parser.error("--lengths and --rounds must be positive")
    for name in args.impls:
        tiles = name.removeprefix("flash:").split("x") if name.startswith("flash:") else None
        if name not in IMPLS and not (tiles and len(tiles) == 2 and all(t.isdigit() and int(t) > 0 for t in tiles)):
            parser.error(f"unknown implementation {name!r}: choose from {', '.join(IMPLS)} or flash:BQxBK")
    if "sdpa" not in args.impls:
        parser.error("--impls must include sdpa: every ratio is against it")
    if args.memory_budget_gb is None:
        args.memory_budget_gb = default_budget_gb()
    impls = ["sdpa"] + [i for i in dict.fromkeys(args.impls) if i != "sdpa"]
    started, load_before = time.time(), loadavg()
    warm_up(impls)
    cases = []
    for n in args.lengths:
        rounds = args.rounds or (5 if n <= 2048 else 3)
        for causal in (False, True):
            for pass_ in PASSES:
                case = Case(n, causal, pass_)
                case.skipped = {i: r for i in impls if (r := skip_reason(i, n, pass_, args))}
                time_case(case, impls, rounds)
                cases.append(case)
                mask = "causal" if causal else "none"
                print(f"  {time.time() - started:5.0f} s: timed N={n} {mask} {pass_}", file=sys.stderr, flush=True)
    mask_rows = mask_cases(args.rounds or 5) if {"flash", "reference"} <= set(impls) else []
    if not args.no_memory:
        measure_memory(cases, impls, args.threads, args.memory_budget_gb)
        print(f"  {time.time() - started:5.0f} s: memory measured", file=sys.stderr, flush=True)
    meta = {
        "machine": describe().line(),
        "torch": torch.__version__,
        "threads": args.threads,
        "rounds": args.rounds or "5 (N <= 2048) or 3",
        "budget_gb": args.memory_budget_gb,
        "load": f"load average {load_before} at start, {loadavg()} at end ({os.cpu_count()} CPUs)",
        "minutes": (time.time() - started) / 60,
        "command": "bench/attention.py " + " ".join(sys.argv[1:]),
    }
    print_tables(cases, mask_rows, impls, meta)
    if args.markdown:
        write_markdown(args.markdown, cases, mask_rows, impls, meta, args.plot)
    if args.plot:
        write_plot(args.plot, cases, impls, meta)


def run_masks(args) -> None:
    """The mask suite: time and ratio per case, then the long sliding window; markdown with --markdown."""
    started, load_before = time.time(), loadavg()
    log = lambda message: print(f"  {time.time() - started:5.0f} s: {message}", file=sys.stderr, flush=True)  # noqa: E731
    rows = attention_masks.time_masks(args.rounds or 5, log=log)
    long_rows = attention_masks.long_window(os.path.abspath(__file__), args.threads)
    header = (describe().line(args.threads, torch.__version__) + "  \n"
              f"batch 1, 8 heads, head dim 64, float32, N = 4096; "
              f"median of {args.rounds or 5} interleaved rounds; load average {load_before} at start, {loadavg()} at end "
              f"({os.cpu_count()} CPUs); {(time.time() - started) / 60:.1f} min; command: bench/attention.py "
              + " ".join(sys.argv[1:]))
    text = attention_masks.format_masks(rows, long_rows, header)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write("# Structured masks, packed documents and GQA against SDPA\n\n" + text)


if __name__ == "__main__":
    main()
