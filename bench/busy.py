"""Flash attention on a busy machine: flash / SDPA with one core taken by another process, against a quiet machine.

Batch 1, 8 heads, head dim 64, float32, causal, N = 4096 (--n); forward, and forward +
backward. The script starts the busy process itself (a Python loop that never sleeps, so
it keeps one core busy) and stops it after the busy rounds. Three long-lived worker
processes (bench/kernel_ab.py's) answer one timed call at a time, in turn, order
alternating: flash_attention from the working tree ("new"), SDPA in the same tree (the
peer), and, with --old REV, flash_attention from that revision ("old"), so the change is
measured beside the code before it in the same run. Quiet rounds come first, then busy.

Reported per pass: each side's median ms quiet and busy, flash / SDPA quiet and busy, and
busy ratio / quiet ratio. Target: that last one at most 1.5 for the new kernel.

    .venv/bin/python bench/busy.py --old HEAD~3      # N = 4096, 5 rounds each; ~2 min
    .venv/bin/python bench/busy.py --quick           # smoke check: N = 256, 1 round, no old
    options: --n N  --rounds R  --threads T  --json PATH
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_ab import ROOT, Worker, extract, resolve  # noqa: E402
from machine import machine_line  # noqa: E402

PASSES = ("forward", "fwd+bwd")
TARGET = 1.5  # busy ratio / quiet ratio, flash / SDPA


def busy_process() -> subprocess.Popen:
    """A process that keeps one core busy until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def time_sides(sides: dict, n: int, pass_: str, rounds: int) -> dict:
    """Median seconds per side: one warm-up call each, then ``rounds`` rounds in alternating order."""
    for call in sides.values():
        call(n, pass_)
    times = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(sides[name](n, pass_))
    return {name: statistics.median(t) for name, t in times.items()}


def measure(workers: dict, n: int, rounds: int) -> dict:
    """{state: {pass: {side: seconds}}} for state quiet, then busy."""
    sides = {"SDPA": lambda n, p: workers["new"].call(n, "causal", p, impl="sdpa"),
             "new": lambda n, p: workers["new"].call(n, "causal", p)}
    if "old" in workers:
        sides["old"] = lambda n, p: workers["old"].call(n, "causal", p)
    result = {}
    for state in ("quiet", "busy"):
        loader = busy_process() if state == "busy" else None
        try:
            if loader:
                time.sleep(0.5)  # let it take its core
            result[state] = {}
            for pass_ in PASSES:
                result[state][pass_] = time_sides(sides, n, pass_, rounds)
                shown = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in result[state][pass_].items())
                print(f"  {state} {pass_}: {shown}", file=sys.stderr, flush=True)
        finally:
            if loader:
                loader.kill()
                loader.wait()
    return result


def rows_of(result: dict) -> list[dict]:
    rows = []
    for pass_ in PASSES:
        for side in [s for s in ("new", "old") if s in result["quiet"][pass_]]:
            quiet = result["quiet"][pass_][side] / result["quiet"][pass_]["SDPA"]
            busy = result["busy"][pass_][side] / result["busy"][pass_]["SDPA"]
            rows.append({"pass": pass_, "kernel": side,
                         "quiet_ms": result["quiet"][pass_][side] * 1e3, "busy_ms": result["busy"][pass_][side] * 1e3,
                         "sdpa_quiet_ms": result["quiet"][pass_]["SDPA"] * 1e3,
                         "sdpa_busy_ms": result["busy"][pass_]["SDPA"] * 1e3,
                         "quiet_ratio": quiet, "busy_ratio": busy, "busy/quiet": busy / quiet})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", metavar="REV", help="also time flash_attention at this revision")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads in each worker (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="N = 256, 1 round")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if args.quick:
        args.n, args.rounds = 256, 1
    if args.n < 1 or args.rounds < 1:
        parser.error("--n and --rounds must be positive")
    commit = None
    if args.old:
        commit = resolve(args.old)
        if commit is None:
            parser.error(f"--old {args.old!r} is not a revision of {ROOT}")
    import torch

    threads = args.threads or torch.get_num_threads()
    print(machine_line(), flush=True)
    started = time.time()
    scratch = tempfile.mkdtemp(prefix="busy-bench-")
    workers = {}
    try:
        workers["new"] = Worker("new", os.path.join(ROOT, "src"), threads)
        if commit:
            workers["old"] = Worker("old", extract(commit, scratch), threads)
        result = measure(workers, args.n, args.rounds)
    except KeyboardInterrupt:
        raise SystemExit("busy: interrupted; the busy process is stopped")
    except RuntimeError as error:
        raise SystemExit(f"busy: {error}")
    finally:
        for w in workers.values():
            w.close()
        shutil.rmtree(scratch, ignore_errors=True)
    rows = rows_of(result)
    old = f"; old = {args.old} ({commit[:10]})" if commit else ""
    print(f"causal, N = {args.n}, {threads} threads, float32, batch 1, 8 heads, head dim 64; busy: one process looping on "
          f"one core; median of {args.rounds} alternating rounds{old}; {(time.time() - started) / 60:.1f} min")
    print(f"{'pass':7}  {'kernel':6}  {'quiet ms':>8}  {'busy ms':>8}  {'SDPA quiet':>10}  {'SDPA busy':>9}  "
          f"{'ratio quiet':>11}  {'ratio busy':>10}  {'busy/quiet':>10}")
    for r in rows:
        verdict = "" if r["kernel"] != "new" else ("  ok" if r["busy/quiet"] <= TARGET else f"  over {TARGET}")
        print(f"{r['pass']:7}  {r['kernel']:6}  {r['quiet_ms']:8.0f}  {r['busy_ms']:8.0f}  {r['sdpa_quiet_ms']:10.0f}  "
              f"{r['sdpa_busy_ms']:9.0f}  {r['quiet_ratio']:11.2f}  {r['busy_ratio']:10.2f}  {r['busy/quiet']:10.2f}{verdict}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"n": args.n, "threads": threads, "rounds": args.rounds, "old": args.old, "commit": commit,
                       "machine": machine_line(), "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
