"""Every headline ratio on this machine, on one screen: so that figures from two CPUs are never mixed.

Batch 1, 8 heads, head dim 64, float32, N = 4096 (--n). Each row times ours against its
peer on the same seeded inputs, interleaved round by round after a warm-up, medians; a
ratio is ours / peer (below 1: ours is faster) and is checked against the target the
project set for it. The first line names the CPU (bench/machine.py). The longer scripts
(bench/attention.py, bench/flex.py, bench/busy.py, bench/models.py) give the full tables;
this one gives the headlines in a few minutes.

    .venv/bin/python bench/summary.py                 # about 3 minutes on 2 cores; add --busy for the busy-machine rows (+1 min)
    .venv/bin/python bench/summary.py --quick         # smoke check: N = 256, 1 round
    options: --n N  --rounds R (default 3)  --busy  --json PATH
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

import selfattn as sa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention import make_inputs, max_diff, run_once  # noqa: E402
from peers import sdpa_shape  # noqa: E402
from machine import machine_line  # noqa: E402

HEADS, DOCUMENTS, SOFTCAP = 8, 8, 30.0


@dataclass
class Row:
    label: str
    pass_: str
    ours: str
    peer: str
    limit: float | None  # ours / peer must be at most this; None: shown, not judged (a peer called slowly, on purpose)
    ours_ms: float = 0.0
    peer_ms: float = 0.0
    ratio: float = 0.0
    diff: float | None = None  # max |ours - peer| where both compute the same thing

    @property
    def verdict(self) -> str:
        if self.limit is None:
            return "info"
        return "pass" if self.ratio <= self.limit else "miss"


def slopes() -> torch.Tensor:
    return torch.tensor([2 ** (-8 * (h + 1) / HEADS) for h in range(HEADS)])


def cases(n: int) -> list[tuple[str, str, float, callable, callable, bool, bool]]:
    """(label, ours name, limit, ours fn, peer fn, same result, gqa) for each headline."""
    s = slopes()
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    causal_alibi_3d = (-s[:, None, None] * (i - j)).masked_fill(j > i, float("-inf"))  # (H, N, N): half the tiles hidden
    causal_alibi = sdpa_shape(causal_alibi_3d)  # (1, H, N, N): SDPA's fast shape, given to both sides
    causal_block = sa.create_block_mask(lambda b, h, q, kv: q >= kv, None, None, n, n)
    alibi = lambda score, b, h, q, kv: score - s[h] * (q - kv)  # noqa: E731
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    length = max(1, n // DOCUMENTS)
    cu = torch.arange(0, n + 1, length, dtype=torch.int32)
    document = torch.arange(n) // length
    block_causal = sdpa_shape((document[:, None] == document[None, :]) & (j <= i))  # (1, 1, N, N)
    packed = lambda x: x[0].transpose(0, 1)  # noqa: E731
    sdpa = F.scaled_dot_product_attention
    return [
        ("plain, no mask", "flash", 1.2, lambda q, k, v: sa.flash_attention(q, k, v), lambda q, k, v: sdpa(q, k, v), True,
         False),
        ("causal", "flash", 1.2, lambda q, k, v: sa.flash_attention(q, k, v, is_causal=True),
         lambda q, k, v: sdpa(q, k, v, is_causal=True), True, False),
        ("GQA 8 query / 2 kv heads", "flash", 1.2, lambda q, k, v: sa.flash_attention(q, k, v, enable_gqa=True),
         lambda q, k, v: sdpa(q, k, v, enable_gqa=True), True, True),
        ("causal + ALiBi score_mod vs SDPA dense bias", "flex", 1 / 3,
         lambda q, k, v: sa.flex_attention(q, k, v, score_mod=alibi, block_mask=causal_block),
         lambda q, k, v: sdpa(q, k, v, attn_mask=causal_alibi), True, False),
        ("causal + ALiBi score_mod vs built-in ALiBi", "flex", 1.5,
         lambda q, k, v: sa.flex_attention(q, k, v, score_mod=alibi, block_mask=causal_block),
         lambda q, k, v: t(sa.flash_attn_func(t(q), t(k), t(v), causal=True, alibi_slopes=s)), True, False),
        ("dense causal + ALiBi bias (1, 8, N, N)", "flash", 0.7,
         lambda q, k, v: sa.flash_attention(q, k, v, attn_mask=causal_alibi),
         lambda q, k, v: sdpa(q, k, v, attn_mask=causal_alibi), True, False),
        # Not a headline: SDPA takes a far slower path for a 3-D mask than for the same numbers in 4-D.
        (SLOW_PEER, "flash", None,
         lambda q, k, v: sa.flash_attention(q, k, v, attn_mask=causal_alibi),
         lambda q, k, v: sdpa(q, k, v, attn_mask=causal_alibi_3d), True, False),
        ("softcap 30 vs plain flash", "flash_attn_func", 1.3,
         lambda q, k, v: t(sa.flash_attn_func(t(q), t(k), t(v), softcap=SOFTCAP)),
         lambda q, k, v: sa.flash_attention(q, k, v), False, False),
        ("varlen 8 causal sequences vs SDPA block-diagonal", "varlen", 0.2,
         lambda q, k, v: sa.flash_attn_varlen_func(packed(q), packed(k), packed(v), cu, cu, length, length,
                                                   causal=True).transpose(0, 1)[None],
         lambda q, k, v: sdpa(q, k, v, attn_mask=block_causal), True, False),
    ]


SLOW_PEER = "dense causal + ALiBi bias vs SDPA given a 3-D mask (8, N, N)"
FORWARD_ONLY = {"dense causal + ALiBi bias (1, 8, N, N)", "GQA 8 query / 2 kv heads", SLOW_PEER}


def measure(n: int, rounds: int) -> list[Row]:
    rows = []
    for label, ours_name, limit, ours, peer, same, gqa in cases(n):
        for pass_ in ("forward",) if label in FORWARD_ONLY else ("forward", "fwd+bwd"):
            backward = pass_ == "fwd+bwd"
            qkv, grad_out = make_inputs(n, backward, kv_heads=2 if gqa else HEADS)
            times = {"ours": [], "peer": []}
            results = {}
            for r in range(rounds + 1):  # round 0 warms up and keeps the results
                for side in ("ours", "peer") if r % 2 else ("peer", "ours"):
                    seconds, result = run_once(ours if side == "ours" else peer, qkv, grad_out, {}, backward)
                    if r:
                        times[side].append(seconds)
                    else:
                        results[side] = result
            row = Row(label, pass_, ours_name, "SDPA" if " vs " not in label else label.split(" vs ")[1], limit,
                      statistics.median(times["ours"]) * 1e3, statistics.median(times["peer"]) * 1e3)
            row.ratio = row.ours_ms / row.peer_ms
            row.diff = max_diff(results["ours"], results["peer"]) if same else None
            rows.append(row)
            print(f"  {label}, {pass_}: {row.ours_ms:.0f} / {row.peer_ms:.0f} ms", file=sys.stderr, flush=True)
    return rows


def busy_rows(n: int, rounds: int) -> list[Row]:
    """bench/busy.py's two rows: flash / SDPA with one core busy, over the same quiet."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "busy.py")
    with tempfile.TemporaryDirectory(prefix="summary-busy-") as scratch:  # not in the source tree
        out = os.path.join(scratch, "busy.json")
        subprocess.run([sys.executable, script, "--n", str(n), "--rounds", str(rounds), "--json", out], check=True,
                       stdout=subprocess.DEVNULL)
        with open(out) as file:
            found = json.load(file)["rows"]
    # ms: flash and SDPA with the core busy; ratio: (flash / SDPA busy) / (flash / SDPA quiet)
    return [Row("causal, one core busy: ratio busy / ratio quiet", r["pass"], "flash", "SDPA", 1.5, r["busy_ms"],
                r["sdpa_busy_ms"], r["busy/quiet"]) for r in found if r["kernel"] == "new"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy", action="store_true", help="also the busy-machine rows (bench/busy.py)")
    parser.add_argument("--quick", action="store_true", help="N = 256, 1 round")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if args.quick:
        args.n, args.rounds = 256, 1
    if args.n < DOCUMENTS or args.rounds < 1:
        parser.error(f"--n must be at least {DOCUMENTS} and --rounds positive")
    started = time.time()
    machine = machine_line()
    print(machine, flush=True)
    rows = measure(args.n, args.rounds)
    if args.busy:
        rows += busy_rows(args.n, args.rounds)
    print(f"N = {args.n}, batch 1, {HEADS} heads, head dim 64, float32; median of {args.rounds} alternating rounds; "
          f"ours / peer (below 1: ours faster); {(time.time() - started) / 60:.1f} min")
    width = max(len(r.label) for r in rows)
    print(f"{'case':{width}}  {'pass':7}  {'ours ms':>8}  {'peer ms':>8}  {'ratio':>6}  {'target':>7}  verdict")
    for r in rows:
        target = "" if r.limit is None else f"<= {r.limit:4.2f}"
        print(f"{r.label:{width}}  {r.pass_:7}  {r.ours_ms:8.0f}  {r.peer_ms:8.0f}  {r.ratio:6.2f}  {target:>7}  {r.verdict}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": machine, "n": args.n, "rounds": args.rounds,
                       "rows": [{**asdict(r), "verdict": r.verdict} for r in rows]}, out, indent=1)


if __name__ == "__main__":
    main()
