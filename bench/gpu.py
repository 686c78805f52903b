"""Our Triton flash attention against PyTorch's and flash-attn's GPU kernels: ms, TFLOP/s and ratios in one run.

For each dtype (float16, bfloat16), mask, N (1k to 16k) and pass ("forward"; "fwd+bwd", which
backpropagates a fixed random dO), on the same seeded inputs (batch x N = 32k tokens, 16 heads, d = 128):

    ours        selfattn.flash_attention(..., backend="triton")
    sdpa-flash  F.scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION): is_causal only, no masks
    sdpa-cudnn  the same under CUDNN_ATTENTION: is_causal, or the mask as a dense (1, 1, N, N) additive bias
                (a dense bool mask if it refuses that)
    flex        torch.compile(flex_attention) with a create_block_mask built once per mask and N; compiled with
                dynamic shapes, so one compilation per mask, dtype and pass serves every N
    flash-attn  flash_attn_func (causal, window_size=(w - 1, 0)) or flash_attn_varlen_func (documents), on
                inputs in its own layout (batch, seq, heads, d); only where `import flash_attn` works

Masks: causal; window, a causal sliding window of 1024 keys (each query sees itself and the 1023 before);
documents, 4 causal documents per sequence with seeded lengths between N/8 and 3N/8. batch x N is 32k,
not FlashAttention-2's 16k, so that batch is never 1: torch.compile specialises a size of 1 and compiles again.

FLOPs count only the (query, key) pairs the mask lets through: forward 4 * batch * heads * pairs * d,
fwd+bwd 3.5x that (FlashAttention-2's convention: the backward is 2.5 forwards). TFLOP/s = FLOPs / time.

Timing: the first call (compilations included) is timed apart (first_call_s in the JSON); after more
warm-up calls, each sample is CUDA events around enough calls to cover ~10 ms, the implementations take
turns in `rounds` rounds, the order rotating, and we report medians. A ratio is ours / peer: below 1,
ours is faster. Before the grid every implementation is checked once per mask (N = 2048, the first dtype)
against float64 SDPA math, output and dQ, dK, dV: it passes within 4x the error of the same math in that
dtype plus 4 ulps of the largest value. If ours fails a check the exit status is 1.

    .venv/bin/python bench/gpu.py                      # the whole grid: 3 to 4 minutes on an H200, half of it compiling
    .venv/bin/python bench/gpu.py --quick              # N = 4k, float16, 3 rounds: about a minute, mostly compiling
    .venv/bin/python bench/gpu.py --interpret --quick  # smoke test on a CPU in Triton's interpreter: times mean nothing

The cases and the implementations are in bench/gpu_cases.py, what is printed in bench/gpu_report.py.
    options: --sizes 1k,4k  --dtypes float16,bfloat16  --masks causal,window,documents  --tokens T  --head-dim D
             --window W  --rounds R  --json PATH  --markdown PATH
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import warnings
from dataclasses import asdict, replace

if "--interpret" in sys.argv[1:]:
    os.environ["TRITON_INTERPRET"] = "1"  # read when Triton is imported, which torch's FlexAttention does

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_cases import (  # noqa: E402
    DOCUMENTS, DTYPES, FLOP_NOTE, INTERPRET, INTERPRET_QUICK, MASKS, PASSES, QUICK, SHORT, Case, Grid, Row, Side,
    State, call, flops, last_backend, make_case, short_error, visible_pairs,
)
from gpu_report import Progress, header, notes, print_table, summary, table, write_markdown  # noqa: E402

NO_GPU = ("bench/gpu.py needs a CUDA GPU, and torch {} sees none; to smoke-test it on the CPU in Triton's "
          "interpreter: .venv/bin/python bench/gpu.py --interpret --quick")


def sample_ms(side: Side, backward: bool, reps: int, cuda: bool) -> float:
    """Milliseconds per call over reps calls: CUDA events on a GPU, the wall clock on the CPU."""
    if not cuda:
        start = time.perf_counter()
        for _ in range(reps):
            call(side, backward)
        return (time.perf_counter() - start) * 1e3 / reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        call(side, backward)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def prepare(case: Case, backward: bool, state: State, only=None) -> tuple[dict[str, Side], dict[str, str]]:
    """Each implementation's first call (compilations happen here): those that ran, and why the others did not."""
    ready, na = {}, {}
    for name, make in state.makers:
        if only is not None and name not in only:
            continue
        key = (name, case.mask, case.dtype, backward)
        if key in state.refused:  # a compilation that failed at another N fails again: do not pay for it twice
            na[name] = state.refused[key]
            continue
        try:
            candidates = make(case, state)
        except Exception as error:  # not installed, CUDA only, no such mask, out of memory building it
            na[name], candidates = short_error(error), []
        for side in candidates:
            if state.cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    call(side, backward)
                    if state.cuda:
                        torch.cuda.synchronize()
                except Exception as error:  # a peer that refuses the case: one line in its cell, not a crash
                    na[name] = short_error(error, caught)
                    if time.perf_counter() - start > 5:
                        state.refused[key] = na[name]
                    if state.cuda:
                        torch.cuda.empty_cache()
                    continue
            side.first_call_s, ready[name] = time.perf_counter() - start, side
            na.pop(name, None)
            break
    return ready, na


def time_row(case: Case, pass_: str, state: State) -> Row:
    """One row: every implementation warmed up, then interleaved rounds of samples; medians, ratios, TFLOP/s."""
    grid, backward = state.grid, pass_ == "fwd+bwd"
    pairs = visible_pairs(case.mask, case.n, grid.window, case.lengths)
    row = Row(SHORT[case.dtype], case.mask, case.n, case.batch, grid.heads, grid.head_dim, pass_, pairs,
              flops(pass_, case.batch, grid.heads, pairs, grid.head_dim), grid.window if case.mask == "window" else None,
              case.lengths)
    sides, na = prepare(case, backward, state)
    row.ours_backend = last_backend() if "ours" in sides else None
    times, reps = {name: [] for name in sides}, {}
    for name, side in list(sides.items()):
        try:
            once = sample_ms(side, backward, 1, state.cuda)
            reps[name] = max(1, min(100, math.ceil(grid.sample_ms / max(once, 1e-3))))
            for _ in range(grid.warmup):
                call(side, backward)
        except Exception as error:
            na[name] = short_error(error)
            del sides[name]
    names = list(sides)
    for r in range(grid.rounds):
        for name in names[r % len(names):] + names[:r % len(names)] if names else []:
            try:
                times[name].append(sample_ms(sides[name], backward, reps[name], state.cuda))
            except Exception as error:
                na[name] = short_error(error)
                names.remove(name)
    if "ours" in names:
        row.ours_ms = statistics.median(times["ours"])
        row.ours_tflops = row.flops / (row.ours_ms * 1e-3) / 1e12
        row.ours_first_call_s = sides["ours"].first_call_s
    else:
        row.ours_error = na.get("ours", "not timed")
    for name, _ in state.makers[1:]:
        if name not in names:
            row.peers[name] = {"n/a": na.get(name, "not timed")}
            continue
        ms, side = statistics.median(times[name]), sides[name]
        row.peers[name] = {"ms": ms, "ratio": row.ours_ms / ms if row.ours_ms else None,
                           "tflops": row.flops / (ms * 1e-3) / 1e12, "first_call_s": side.first_call_s,
                           **({"note": side.note} if side.note else {})}
    return row


# ---- the correctness check ----

@contextlib.contextmanager
def reductions_in(dtype: torch.dtype):
    """SDPA's math backend reducing in the inputs' half precision (by default it computes in float32)."""
    cuda = torch.backends.cuda
    if dtype not in (torch.float16, torch.bfloat16) or not hasattr(cuda, "allow_fp16_bf16_reduction_math_sdp"):
        yield
        return
    before = cuda.fp16_bf16_reduction_math_sdp_allowed()
    cuda.allow_fp16_bf16_reduction_math_sdp(True)
    try:
        yield
    finally:
        cuda.allow_fp16_bf16_reduction_math_sdp(before)


def sdpa_math(case: Case, dtype: torch.dtype) -> list[torch.Tensor]:
    """O, dQ, dK, dV from PyTorch's math backend in dtype, with the dense mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (t.detach().to(dtype).requires_grad_() for t in case.qkv)
    with sdpa_kernel(SDPBackend.MATH), reductions_in(dtype):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=case.structured.dense(case.device))
        out.backward(case.grad_out.to(dtype))
    return [out.detach(), q.grad, k.grad, v.grad]


def check_mask(mask: str, state: State) -> list[dict]:
    """Every implementation's output and gradients against float64 SDPA math, for one mask; a peer without a
    backward has its output checked alone."""
    grid = state.grid
    case = make_case(mask, grid.check_n, grid.check_batch, grid.dtypes[0], grid)
    reference, baseline = sdpa_math(case, torch.float64), sdpa_math(case, case.dtype)
    eps = torch.finfo(case.dtype).eps
    sides, na = prepare(case, True, state)
    forward_only, still_na = prepare(case, False, state, only=set(na) - {"ours"})
    results = []
    for name, _ in state.makers:
        if name not in sides and name not in forward_only:
            results.append({"mask": mask, "side": name, "n/a": still_na.get(name, na.get(name))})
            continue
        side, backward = (sides[name], True) if name in sides else (forward_only[name], False)
        got = [call(side, backward).detach()] + ([t.grad for t in side.inputs] if backward else [])
        diffs, limits = {}, {}
        for label, x, ref, base in zip(("out", "dq", "dk", "dv"), got, reference, baseline):
            diffs[label] = float(((side.unpack(x) if side.unpack else x).double() - ref).abs().max())
            limits[label] = 4 * float((base.double() - ref).abs().max()) + 4 * eps * float(ref.abs().max())
        results.append({"mask": mask, "side": name, "n": case.n, "batch": case.batch, "dtype": SHORT[case.dtype],
                        "max_diff": diffs, "tolerance": limits, "passed": all(diffs[x] <= limits[x] for x in diffs),
                        **({} if backward else {"forward only": na[name]})})
    return results


# ---- the command ----

def sizes(text: str) -> tuple[int, ...]:
    """"1k,4096" -> (1024, 4096)."""
    try:
        return tuple(int(x[:-1]) * 1024 if x.lower().endswith("k") else int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes are integers such as 1024 or 1k, comma-separated: {text!r}") from None


def one_of(choices):
    def parse(text: str) -> tuple[str, ...]:
        if not set(text.split(",")) <= set(choices):
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}: {text!r}")
        return tuple(text.split(","))
    return parse


def parse_grid(argv=None) -> tuple[Grid, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 4k, float16, 3 rounds (interpreted: N = 64, 1 round)")
    parser.add_argument("--interpret", action="store_true", help="smoke test on the CPU: Triton's interpreter, tiny sizes")
    parser.add_argument("--sizes", type=sizes, help="N values, e.g. 1k,2k,4k")
    parser.add_argument("--dtypes", type=one_of(tuple(DTYPES)), help="float16,bfloat16 (float32 with --interpret)")
    parser.add_argument("--masks", type=one_of(MASKS), help="causal,window,documents")
    parser.add_argument("--tokens", type=int, help="batch x N (default 32768)")
    parser.add_argument("--head-dim", type=int, help="d (default 128)")
    parser.add_argument("--window", type=int, help="keys in the causal sliding window (default 1024)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--markdown", metavar="PATH", help="the table as a page, for docs/")
    args = parser.parse_args(argv)
    grid = INTERPRET if args.interpret else Grid()
    grid = replace(grid, **(INTERPRET_QUICK if args.interpret else QUICK)) if args.quick else grid
    chosen = {"sizes": args.sizes, "dtypes": args.dtypes and tuple(DTYPES[d] for d in args.dtypes), "masks": args.masks,
              "tokens": args.tokens, "head_dim": args.head_dim, "window": args.window, "rounds": args.rounds}
    grid = replace(grid, **{k: v for k, v in chosen.items() if v is not None})
    if min(grid.sizes) < 8 * DOCUMENTS or grid.tokens < max(grid.sizes) or min(grid.head_dim, grid.window, grid.rounds) < 1:
        parser.error(f"every N must be at least {8 * DOCUMENTS} and at most --tokens; --head-dim, --window, --rounds positive")
    for path in (args.json, args.markdown):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"no folder for {path}")
    return grid, args


def main(argv=None) -> int:
    grid, args = parse_grid(argv)
    if not args.interpret and not torch.cuda.is_available():
        print(NO_GPU.format(torch.__version__), file=sys.stderr)
        return 2
    try:
        import triton  # noqa: F401
    except ImportError:
        print("bench/gpu.py times our Triton kernel, and Triton is not installed here (pip install triton)", file=sys.stderr)
        return 2
    if args.interpret:
        torch.set_num_threads(1)  # tiny tensors: threads cost more than they save
    started, state = time.time(), State(grid)
    lines = header(state)
    print("\n".join(lines), flush=True)
    progress = Progress(len(grid.masks) * (1 + len(grid.dtypes) * len(grid.sizes) * len(PASSES)))
    print(f"\ncorrectness: N = {grid.check_n}, batch {grid.check_batch}, {SHORT[grid.dtypes[0]]}: max |x - float64 "
          f"SDPA math| of O, dQ, dK, dV; within 4x the same math's in {SHORT[grid.dtypes[0]]} + 4 ulps", flush=True)
    checks = []
    for mask in grid.masks:
        checks += check_mask(mask, state)
        for c in checks[-len(state.makers):]:
            diffs = "".join(f"{k} {v:.1e}  " for k, v in c.get("max_diff", {}).items())
            verdict = f"n/a: {c['n/a']}" if "n/a" in c else "ok" if c["passed"] else "!! FAILED"
            verdict += f" (forward only: {c['forward only']})" if "forward only" in c else ""
            print(f"  {mask:9}  {c['side']:10}  {diffs}{verdict}", flush=True)
        progress.step(f"checked {mask}")
    rows = []
    for dtype in grid.dtypes:
        for mask in grid.masks:
            for n in grid.sizes:
                case = make_case(mask, n, grid.tokens // n, dtype, grid)
                for pass_ in PASSES:
                    rows.append(time_row(case, pass_, state))
                    progress.step(summary(rows[-1]))
                del case
                if state.cuda:
                    torch.cuda.empty_cache()
    progress.close()
    columns, cells = table(rows, [name for name, _ in state.makers[1:]])
    ours_checks = [c for c in checks if c["side"] == "ours"]
    passed = len(ours_checks) == len(grid.masks) and all(c.get("passed") for c in ours_checks)
    extra, seconds = notes(rows, checks, passed), time.time() - started
    print(f"\nmedians in ms; {FLOP_NOTE}; the run took {seconds:.0f} s")
    print_table(columns, cells)
    print("\n".join([""] + extra))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"command": " ".join(["bench/gpu.py"] + sys.argv[1:]), "header": lines,
                       "grid": {**asdict(grid), "dtypes": [SHORT[d] for d in grid.dtypes]}, "flop_convention": FLOP_NOTE,
                       "ours_backend": state.ours_backend, "checks": checks, "checks_passed": passed,
                       "rows": [{("pass" if k == "pass_" else k): v for k, v in asdict(r).items()} for r in rows],
                       "notes": extra, "seconds": seconds}, out, indent=1)
    if args.markdown:
        write_markdown(args.markdown, lines, columns, cells, extra)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
