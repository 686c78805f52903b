"""Old kernel against new in one run: selfattn.flash_attention at two revisions, interleaved.

The plain and causal cases of bench/attention.py (batch 1, 8 heads, head dim 64, float32;
no mask and is_causal=True; forward without autograd and forward + backward) for the
``src`` of an old revision and the ``src`` of the working tree. Each side runs in its own
long-lived worker process that imports selfattn from its own tree (PYTHONPATH=<tree>/src)
and answers one timed call per request over stdin/stdout, so the two never run at the
same time and take turns round by round (the order alternates). Both build the same seeded
inputs (bench/attention.py's). We print the median per side, the ratio new / old (below
1: the change made it faster) as the median of each round's paired ratio with a 90%
bootstrap interval, and the max |new - old| of the outputs and gradients.

On 2 shared cores one pair of processes can be several percent apart for its whole life
with the same code on both sides (``--old HEAD`` on a clean tree measured 0.94-1.18 with
one pair): --pairs P starts P fresh pairs, --rounds rounds each, so that this averages out.

The old revision's ``src`` is extracted with ``git archive`` into a temporary folder, and
the working tree's copied there at the start (edits made during a run do not reach it); the
folder is removed at the end, also after an error or Ctrl-C.

    .venv/bin/python bench/kernel_ab.py --old HEAD~1               # N = 4096, 5 rounds
    .venv/bin/python bench/kernel_ab.py --old v0.3 --n 2048,4096 --rounds 7
    .venv/bin/python bench/kernel_ab.py --old 87a0184 --pairs 6 --rounds 5 --cases none,causal,gqa
    .venv/bin/python bench/kernel_ab.py --old HEAD --quick         # smoke check: N = 256, 1 round
    .venv/bin/python bench/kernel_ab.py --old HEAD~5 --cases none,causal,gqa,alibi-score_mod,shared-float-causal
    options: --threads T  --pairs P  --json PATH  --cases (none, causal; also gqa: 8 query / 2 kv heads, alibi-score_mod:
             flex_attention with causal + ALiBi as a user's score_mod and a causal block mask, shared-float-causal:
             one (1, 1, N, N) causal 0 / -inf float mask)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADS, D_HEAD = 8, 64
MASKS = ("none", "causal")
# --cases beyond the default two: GQA 8 query / 2 kv heads (no mask), causal + ALiBi as a user's score_mod
# through flex_attention with a causal block mask, and one causal 0 / -inf float mask shared by the heads.
EXTRA = ("gqa", "alibi-score_mod", "shared-float-causal")
SETTLE_S = 0.1
PASSES = ("forward", "fwd+bwd")
BOOTSTRAP = 2000  # resamples for the interval of the median ratio


_calls: dict = {}


def attention_call(selfattn, torch, impl: str, mask: str, n: int):
    """(q, k, v) -> O for a case; its masks and score_mod made once per (case, N) and kept."""
    key = (impl, mask, n)
    if key in _calls:
        return _calls[key]
    F = torch.nn.functional
    if impl == "sdpa":  # the peer, for bench/busy.py
        call = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=mask == "causal")  # noqa: E731
    elif mask in ("none", "causal"):
        call = lambda q, k, v: selfattn.flash_attention(q, k, v, is_causal=mask == "causal")  # noqa: E731
    elif mask == "gqa":
        call = lambda q, k, v: selfattn.flash_attention(q, k, v, enable_gqa=True)  # noqa: E731
    elif mask == "alibi-score_mod":
        slopes = torch.tensor([2 ** (-8 * (h + 1) / HEADS) for h in range(HEADS)])
        block = selfattn.create_block_mask(lambda b, h, q, kv: q >= kv, None, None, n, n)
        alibi = lambda score, b, h, q, kv: score - slopes[h] * (q - kv)  # noqa: E731
        call = lambda q, k, v: selfattn.flex_attention(q, k, v, score_mod=alibi, block_mask=block)  # noqa: E731
    elif mask == "shared-float-causal":
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        bias = torch.zeros(1, 1, n, n).masked_fill(j > i, float("-inf"))
        call = lambda q, k, v: selfattn.flash_attention(q, k, v, attn_mask=bias)  # noqa: E731
    else:
        raise SystemExit(f"unknown case {mask!r}")
    _calls.clear()
    _calls[key] = call
    return call


def worker(threads: int, expected_src: str) -> None:
    """Answer requests {"n", "mask", "pass", "save", "impl"} with {"seconds"}: one call each, after the inputs exist.
    impl "sdpa" times torch's scaled_dot_product_attention on the same inputs instead of flash_attention."""
    import torch

    import selfattn

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it closes our stdin and cleans up
    torch.set_num_threads(threads)
    where = os.path.dirname(os.path.dirname(os.path.abspath(selfattn.__file__)))
    if os.path.realpath(where) != os.path.realpath(expected_src):
        raise SystemExit(f"worker imported selfattn from {where}, not {expected_src}")
    inputs = {}
    print(json.dumps({"ready": selfattn.__file__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        backward = request["pass"] == "fwd+bwd"
        n, mask = request["n"], request["mask"]
        key = (n, backward, mask == "gqa")
        if key not in inputs:
            inputs.clear()  # one size at a time: the cases come ordered by N
            g = torch.Generator().manual_seed(0)  # as bench/attention.py's make_inputs
            kv_heads = 2 if mask == "gqa" else HEADS
            qkv = [torch.randn(1, HEADS, n, D_HEAD, generator=g)] + [torch.randn(1, kv_heads, n, D_HEAD, generator=g)
                                                                      for _ in range(2)]
            inputs[key] = ([t.requires_grad_(backward) for t in qkv], torch.randn(1, HEADS, n, D_HEAD, generator=g))
        qkv, grad_out = inputs[key]
        for t in qkv:
            t.grad = None
        call = attention_call(selfattn, torch, request.get("impl", "flash"), mask, n)
        start = time.perf_counter()
        out = call(*qkv)
        if backward:
            out.backward(grad_out)
        seconds = time.perf_counter() - start
        if request.get("save"):
            torch.save([out.detach()] + ([t.grad for t in qkv] if backward else []), request["save"])
        del out
        print(json.dumps({"seconds": seconds}), flush=True)


class Worker:
    """A worker process for one tree, fed one request at a time."""

    def __init__(self, label: str, src: str, threads: int) -> None:
        self.label = label
        env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
        command = [sys.executable, os.path.abspath(__file__), "--worker", src, "--threads", str(threads)]
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.imported = self._answer()["ready"]

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.label} worker stopped (exit status {self.process.wait()}); its error is above")
        return json.loads(line)

    def call(self, n: int, mask: str, pass_: str, save: str | None = None, impl: str = "flash") -> float:
        # torch's threads spin for a few milliseconds after a call before they sleep; the other side's would
        # still be running when this side starts and look like a competing process (kernels.workers): wait.
        time.sleep(SETTLE_S)
        self.process.stdin.write(json.dumps({"n": n, "mask": mask, "pass": pass_, "save": save, "impl": impl}) + "\n")
        self.process.stdin.flush()
        return self._answer()["seconds"]

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def resolve(rev: str) -> str | None:
    """The commit a revision names, or None."""
    found = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                           capture_output=True, text=True, check=False)
    return found.stdout.strip() if found.returncode == 0 else None


def extract(commit: str, folder: str) -> str:
    """The commit's src/ under folder (git archive | tar); -> the path of that src."""
    archive = subprocess.Popen(["git", "-C", ROOT, "archive", commit, "src"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", folder], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        raise SystemExit(f"kernel_ab: git archive {commit} src failed")
    return os.path.join(folder, "src")


def max_diff(old_path: str, new_path: str) -> float:
    import torch

    old, new = torch.load(old_path, weights_only=True), torch.load(new_path, weights_only=True)
    return max(float((a - b).abs().max()) for a, b in zip(old, new))


def compare(workers: dict, lengths, rounds: int, scratch: str, masks=MASKS, save: bool = True) -> list[dict]:
    """Per (N, mask, pass): each side's seconds, round by round, and the max |diff| (when ``save``)."""
    rows = []
    for n in lengths:
        for mask in masks:
            for pass_ in PASSES:
                saved = {side: os.path.join(scratch, f"{side}.pt") if save else None for side in workers}
                for side, w in workers.items():  # warm-up, which also saves the results
                    w.call(n, mask, pass_, saved[side])
                times = {side: [] for side in workers}
                sides = list(workers)
                for r in range(rounds):
                    for side in sides if r % 2 == 0 else sides[::-1]:
                        times[side].append(workers[side].call(n, mask, pass_))
                rows.append({"n": n, "mask": mask, "pass": pass_, "old_s": times["old"], "new_s": times["new"],
                             "max_diff": max_diff(saved["old"], saved["new"]) if save else None})
                print(f"  N={n} {mask} {pass_}: old {statistics.median(times['old']) * 1e3:.1f} ms, "
                      f"new {statistics.median(times['new']) * 1e3:.1f} ms", file=sys.stderr, flush=True)
    return rows


def summarize(runs: list[list[dict]]) -> list[dict]:
    """One row per case from every worker pair's rounds: each side's median ms, and new / old as the
    median of the rounds' paired ratios (each round's two calls ran back to back, so a slow spell of the
    machine touches both) with a 90% bootstrap interval for that median (seeded)."""
    rows = []
    for parts in zip(*runs):
        old = [t for part in parts for t in part["old_s"]]
        new = [t for part in parts for t in part["new_s"]]
        ratios = [b / a for a, b in zip(old, new)]
        draw = random.Random(0)
        medians = sorted(statistics.median(draw.choices(ratios, k=len(ratios))) for _ in range(BOOTSTRAP))
        low, high = medians[int(0.05 * BOOTSTRAP)], medians[int(0.95 * BOOTSTRAP) - 1]
        first = parts[0]
        rows.append({"n": first["n"], "mask": first["mask"], "pass": first["pass"], "old_ms": statistics.median(old) * 1e3,
                     "new_ms": statistics.median(new) * 1e3, "new/old": statistics.median(ratios),
                     "interval": [low, high], "rounds": len(ratios), "max_diff": first["max_diff"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", metavar="REV", help="the revision to compare against (a commit, tag or branch)")
    parser.add_argument("--n", type=lambda s: [int(x) for x in s.split(",")], default=[4096], help="lengths, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=1,
                        help="fresh old/new worker processes this many times, --rounds rounds each (default 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in each worker (default: torch's)")
    parser.add_argument("--cases", type=lambda s: s.split(","), default=list(MASKS),
                        help=f"comma-separated, from {','.join(MASKS + EXTRA)} (default: none,causal)")
    parser.add_argument("--quick", action="store_true", help="N = 256, 1 round")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--worker", metavar="SRC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads is None:
        import torch

        args.threads = torch.get_num_threads()
    if args.worker:
        worker(args.threads, args.worker)
        return
    if not args.old:
        parser.error("--old REV is required")
    commit = resolve(args.old)
    if commit is None:
        parser.error(f"--old {args.old!r} is not a revision of {ROOT}")
    if args.quick:
        args.n, args.rounds = [256], 1
    unknown = [c for c in args.cases if c not in MASKS + EXTRA]
    if unknown:
        parser.error(f"unknown --cases {','.join(unknown)}; choose from {','.join(MASKS + EXTRA)}")
    if any(n < 1 for n in args.n) or args.rounds < 1 or args.pairs < 1:
        parser.error("--n, --rounds and --pairs must be positive")
    started = time.time()
    scratch = tempfile.mkdtemp(prefix="kernel-ab-")
    workers = {}
    runs = []
    try:
        old_src = extract(commit, scratch)
        # The working tree as it is now: the later pairs import this copy, not files edited during the run.
        new_src = shutil.copytree(os.path.join(ROOT, "src"), os.path.join(scratch, "new", "src"),
                                  ignore=shutil.ignore_patterns("__pycache__"))
        for pair in range(args.pairs):  # fresh processes each time: a process's own luck (its memory's placement) averages out
            workers = {"old": Worker("old", old_src, args.threads), "new": Worker("new", new_src, args.threads)}
            if pair % 2:  # the side that starts each round alternates within a pair; the side started first, between pairs
                workers = {"new": workers["new"], "old": workers["old"]}
            runs.append(compare(workers, args.n, args.rounds, scratch, args.cases, save=pair == 0))
            for w in workers.values():
                w.close()
        rows = summarize(runs)
    except KeyboardInterrupt:
        raise SystemExit("kernel_ab: interrupted; the old tree is removed")
    except RuntimeError as error:  # a worker stopped: its traceback is above
        raise SystemExit(f"kernel_ab: {error}")
    finally:
        for w in workers.values():
            w.close()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"selfattn.flash_attention, {args.old} = {commit[:10]} (old) against the working tree (new); {args.threads} threads, float32, "
          f"batch 1, {HEADS} heads, head dim {D_HEAD}; {args.pairs} worker pair(s) x {args.rounds} alternating rounds; "
          f"new/old = the median of the rounds' paired ratios, with its 90% bootstrap interval; "
          f"{(time.time() - started) / 60:.1f} min")
    print(f"{'N':>6}  {'case':19}  {'pass':7}  {'old ms':>9}  {'new ms':>9}  {'new/old':>7}  {'90% interval':>13}  max |new - old|")
    for r in rows:
        low, high = r["interval"]
        print(f"{r['n']:>6}  {r['mask']:19}  {r['pass']:7}  {r['old_ms']:9.1f}  {r['new_ms']:9.1f}  {r['new/old']:7.2f}  "
              f"{low:6.2f}-{high:<6.2f}  {r['max_diff']:.1e}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"old": args.old, "commit": commit, "threads": args.threads, "rounds": args.rounds, "pairs": args.pairs,
                       "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
