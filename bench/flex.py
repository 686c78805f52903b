"""Issue 18's speed targets in one run: FlexAttention, softcap, dense float masks, windows and varlen.

Batch 1, 8 heads, head dim 64, float32, N = 4096 (--n), CPU. Each case compares
implementations on the same seeded inputs, "forward" (inputs without requires_grad) and
"fwd+bwd" (backpropagates a fixed random dO); within a case they are interleaved round by
round in a rotating order after one warm-up round, and we report medians. Every ratio is
a time ratio, ours / peer: below 1 means ours is faster.

    a  causal + ALiBi (slopes 2^(-8h/H), bias -slope (i - j)): selfattn.flex_attention with a
       causal block mask, against torch.compile(torch's flex_attention) (forward only: torch
       2.13 has no FlexAttention backward on the CPU; its compile time has its own column)
       and SDPA with the equivalent dense float bias (causal -inf + ALiBi).
       It also times the same ALiBi built in (flash_attn_func(causal=True, alibi_slopes=...)).
       Targets: ours forward <= compiled flex; ours fwd+bwd <= 1/3 of SDPA's; the user's score_mod
       at most 1.5x the built-in ALiBi, forward and fwd+bwd.
    b  softcap 30 tanh(s / 30): flash_attn_func(softcap=30) and flex_attention(score_mod) against
       plain flash_attention without a mask. Target <= 1.3.
    c  dense masks: flash_attention and scaled_dot_product_attention against SDPA with the same
       mask: an all-zero float mask, an ALiBi bias -slope |i - j| (no -inf), causal + ALiBi as one
       float mask with -inf, a bool causal mask, one causal 0 / -inf float mask (1, 1, N, N) shared by the
       heads, and the two without structure: a random normal float bias and a random bool mask (each key
       visible with probability 1/2). Targets: <= 1.2 where there is nothing to skip (the zero and the
       random masks), forward <= 0.7 for the three that hide half the tiles, else <= 1.0.
       The zero and random float cases also time "bare torch loop" (forward): the same tiles as
       the fewest torch calls that compute them, without flash_attention's checks and bookkeeping.
    d  a sliding window (255 each side), and 8 packed documents of N/8, as dense bool tensors
       against the same masks as rules, both through flash_attention. Target <= 1.25.
    e  flash_attn_varlen_func on 8 causal sequences of N/8 against SDPA with the dense
       block-diagonal causal mask on (1, H, N, d). Target <= 0.2 (5x faster).

    .venv/bin/python bench/flex.py --write-docs       # full run; writes docs/flex-bench.{md,png}
    .venv/bin/python bench/flex.py --quick            # smoke check: N = 256, 1 round, nothing written
    options: --n N  --rounds R (default 5)  --threads T  --window W  --no-compile  --json PATH  --markdown PATH  --plot PATH
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import selfattn as sa
from selfattn.masks import DocumentMask

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402
from attention import loadavg, make_inputs, max_diff, run_once
from peers import sdpa_shape

HEADS, D_HEAD, SOFTCAP, DOCUMENTS = 8, 64, 30.0, 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DENSE = ("c. zero float mask", "c. ALiBi float bias", "c. causal + ALiBi float mask", "c. causal bool mask",
         "c. random float bias", "c. random bool mask", "c. shared causal float mask")
# Masks with nothing to skip or bound away, where the kernel does SDPA's work in eager torch calls: at most 1.2x.
UNSTRUCTURED = ("c. zero float mask", "c. random float bias", "c. random bool mask")
HIDING = ("c. causal + ALiBi float mask", "c. causal bool mask", "c. shared causal float mask")  # forward <= 0.7
WINDOW, DOCS, VARLEN = "d. sliding window", "d. packed documents", "e. varlen 8 causal sequences"
CASES = ("a. causal + ALiBi", "b. softcap", *DENSE, WINDOW, DOCS, VARLEN)
BARE = (DENSE[0], DENSE[4])  # float masks without -inf, where the bare loop (no running max) is exact


@dataclass
class Case:
    name: str
    pass_: str
    impls: dict  # impl -> fn(q, k, v) -> (1, H, N, d); the first is the peer of the "x peer" column
    checks: dict = field(default_factory=dict)  # impl -> the impl whose result it must match
    na: dict = field(default_factory=dict)  # impl -> why it is not timed
    ms: dict = field(default_factory=dict)  # impl -> median ms
    diff: dict = field(default_factory=dict)  # impl -> max |diff| against its check


@dataclass
class Target:
    label: str
    case: str
    pass_: str
    ours: str
    peer: str
    limit: float  # ours / peer must be <= limit
    value: float | None = None
    why_na: str | None = None

    @property
    def verdict(self) -> str:
        return "n/a" if self.value is None else ("pass" if self.value <= self.limit else "FAIL")


def alibi_slopes(heads: int = HEADS) -> torch.Tensor:
    """The standard geometric slopes 2^(-8 h / H), h = 1 .. H.   -> (H,)"""
    return 2.0 ** (-8.0 * torch.arange(1, heads + 1) / heads)


def short_error(error: Exception) -> str:
    """The exception's type and first sentence, for one table cell."""
    first = (str(error).strip().splitlines() or [""])[0].split(". ")[0]
    return f"{type(error).__name__}: {first[:120]}"


def is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def twice(make):
    """(the result, "first ms, again ms") of two calls: the first pays for lazy imports and tracing."""
    times = []
    for _ in range(2):
        start = time.perf_counter()
        result = make()
        times.append((time.perf_counter() - start) * 1e3)
    return result, f"{times[0]:.0f} ms first call, {times[1]:.0f} ms again"


def bare_tile_loop(q, k, v, mask, block: int = 512):
    """The floor of a tiled forward written in torch calls, for a float mask of small entries.

    Per 512 x 512 tile: one product, the mask's add, exp, a row sum and a product into the
    output; no checks, no block states, no running max (only exact because the bench's scores
    and masks are small) and no other bookkeeping. Not for use: it measures what the torch
    calls alone cost, against which flash_attention's own overhead can be read.
    """
    n, scale = q.shape[-2], q.shape[-1] ** -0.5
    keys_t, out = k.transpose(-2, -1), torch.empty_like(q)
    for r0 in range(0, n, block):
        rows = q[..., r0:r0 + block, :] * scale
        acc, sums = torch.zeros_like(rows), rows.new_zeros((*rows.shape[:-1], 1))
        for c0 in range(0, n, block):
            weights = (rows @ keys_t[..., c0:c0 + block]).add_(mask[..., r0:r0 + block, c0:c0 + block]).exp_()
            sums += weights.sum(dim=-1, keepdim=True)
            acc += weights @ v[..., c0:c0 + block, :]
        out[..., r0:r0 + block, :] = acc / sums
    return out


def torch_flex(n: int, alibi, causal, q, k, v):
    """torch.compile(flex_attention) with its block mask: (fn or None, setup info)."""
    info = {}
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        mask, info["torch create_block_mask"] = twice(lambda: create_block_mask(causal, None, None, n, n, device="cpu"))
        compiled = torch.compile(flex_attention)
        start = time.perf_counter()
        with torch.no_grad():
            compiled(q, k, v, score_mod=alibi, block_mask=mask)
        info["torch.compile(flex_attention), first call"] = f"{time.perf_counter() - start:.1f} s (compiles)"
    except Exception as error:  # no C compiler, an inductor failure, an old torch: one line, no traceback
        info["torch flex n/a"] = short_error(error)
        return None, info
    try:  # torch 2.13 has no CPU backward; if a later one does, the fwd+bwd case times it too
        x = torch.randn(1, 1, 128, 16, requires_grad=True)
        flex_attention(x, x, x).sum().backward()
        info["torch flex backward"] = "available"
    except Exception as error:
        info["torch flex backward"] = short_error(error)
    return (lambda q, k, v: compiled(q, k, v, score_mod=alibi, block_mask=mask)), info


def build_cases(n: int, window: int, inputs: dict, compile_flex: bool = True) -> tuple[list[Case], dict]:
    """Every case and pass, with its implementations; setup times (block masks, compile) in the dict."""
    slopes = alibi_slopes()
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    # Every dense mask in SDPA's fastest accepted shape, 4-D and contiguous (peers.sdpa_shape), for every side.
    causal_2d = j <= i  # (N, N)
    causal_bool = sdpa_shape(causal_2d)  # (1, 1, N, N)
    causal_alibi = sdpa_shape((-slopes[:, None, None] * (i - j)).masked_fill(~causal_2d, float("-inf")))  # (1, H, N, N)
    alibi_abs = sdpa_shape(-slopes[:, None, None] * (i - j).abs())  # (1, H, N, N)
    noise = torch.Generator().manual_seed(18)
    random_bias = sdpa_shape(torch.randn(n, n, generator=noise))  # no structure: every tile is added, nothing skipped
    random_bool = sdpa_shape(torch.rand(n, n, generator=noise) < 0.5)  # half the keys of every row, scattered
    shared_causal = torch.zeros(1, 1, n, n).masked_fill(~causal_bool, float("-inf"))  # one 0 / -inf mask for all heads

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def softcap(score, b, h, q_idx, kv_idx):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    our_mask, made = twice(lambda: sa.create_block_mask(causal, None, None, n, n))
    setup = {"selfattn create_block_mask": made}
    compiled, info = torch_flex(n, alibi, causal, *inputs["forward"][0]) if compile_flex else (None, {"torch flex n/a": "--no-compile"})
    setup.update(info)
    no_backward = info.get("torch flex backward", "")
    t = lambda x: x.transpose(1, 2)  # (B, H, N, d) <-> (B, N, H, d) views
    window_bool = sdpa_shape(sa.sliding_window_mask(n, left=window, right=window))
    window_rule = sa.sliding_window_mask(n, left=window, right=window, structured=True)
    length = n // DOCUMENTS
    cu = torch.arange(0, n + 1, length, dtype=torch.int32)
    document = torch.arange(n) // length
    documents_2d = document[:, None] == document[None, :]  # (N, N)
    documents_bool = sdpa_shape(documents_2d)
    documents_rule = DocumentMask([length] * DOCUMENTS)
    block_causal = sdpa_shape(causal_2d & documents_2d)
    packed = lambda x: x[0].transpose(0, 1)  # (1, H, N, d) -> (N, H, d) view

    cases = []
    for pass_ in ("forward", "fwd+bwd"):
        a = {"sdpa dense bias": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=causal_alibi),
             "ours flex": lambda q, k, v: sa.flex_attention(q, k, v, score_mod=alibi, block_mask=our_mask),
             "built-in alibi": lambda q, k, v: t(sa.flash_attn_func(t(q), t(k), t(v), causal=True, alibi_slopes=slopes))}
        na = {}
        if compiled is None:
            na["torch flex compiled"] = setup["torch flex n/a"]
        elif pass_ == "forward" or no_backward == "available":
            a["torch flex compiled"] = compiled
        else:
            na["torch flex compiled"] = "torch has no FlexAttention backward on the CPU (setup: torch flex backward)"
        cases.append(Case(CASES[0], pass_, a, {"ours flex": "sdpa dense bias", "torch flex compiled": "sdpa dense bias",
                                               "built-in alibi": "sdpa dense bias"}, na))
        b = {"flash plain": lambda q, k, v: sa.flash_attention(q, k, v),
             "flash_attn_func softcap": lambda q, k, v: t(sa.flash_attn_func(t(q), t(k), t(v), softcap=SOFTCAP)),
             "flex softcap": lambda q, k, v: sa.flex_attention(q, k, v, score_mod=softcap)}
        cases.append(Case(CASES[1], pass_, b, {"flash_attn_func softcap": "flex softcap"}))
        masks = (sdpa_shape(torch.zeros(n, n)), alibi_abs, causal_alibi, causal_bool, random_bias, random_bool, shared_causal)
        for name, mask in zip(DENSE, masks):
            c = {"sdpa": lambda q, k, v, m=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                 "flash": lambda q, k, v, m=mask: sa.flash_attention(q, k, v, attn_mask=m),
                 "reference": lambda q, k, v, m=mask: sa.scaled_dot_product_attention(q, k, v, attn_mask=m)}
            checks = {"flash": "sdpa", "reference": "sdpa"}
            if pass_ == "forward" and name in BARE:
                c["bare torch loop"] = lambda q, k, v, m=mask: bare_tile_loop(q, k, v, m)
                checks["bare torch loop"] = "sdpa"
            cases.append(Case(name, pass_, c, checks))
        d = {"flash structured": lambda q, k, v: sa.flash_attention(q, k, v, attn_mask=window_rule),
             "flash dense bool": lambda q, k, v: sa.flash_attention(q, k, v, attn_mask=window_bool),
             "sdpa bool": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=window_bool)}
        cases.append(Case(WINDOW, pass_, d, {"flash dense bool": "sdpa bool", "flash structured": "sdpa bool"}))
        d2 = {"flash structured": lambda q, k, v: sa.flash_attention(q, k, v, attn_mask=documents_rule),
              "flash dense bool": lambda q, k, v: sa.flash_attention(q, k, v, attn_mask=documents_bool)}
        cases.append(Case(DOCS, pass_, d2, {"flash dense bool": "flash structured"}))
        e = {"sdpa block-diagonal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=block_causal),
             "flash_attn_varlen_func": lambda q, k, v: sa.flash_attn_varlen_func(
                 packed(q), packed(k), packed(v), cu, cu, length, length, causal=True).transpose(0, 1)[None]}
        cases.append(Case(VARLEN, pass_, e, {"flash_attn_varlen_func": "sdpa block-diagonal"}))
    return cases, setup


def targets() -> list[Target]:
    out = []
    for pass_ in ("forward", "fwd+bwd"):
        if pass_ == "forward":
            out.append(Target("a. ours flex <= torch compiled flex", CASES[0], pass_, "ours flex", "torch flex compiled", 1.0))
        else:
            out.append(Target("a. ours flex 3x faster than SDPA dense bias", CASES[0], pass_, "ours flex", "sdpa dense bias", 1 / 3))
        out.append(Target("a. a user's score_mod <= 1.5 x the same bias built in", CASES[0], pass_, "ours flex",
                          "built-in alibi", 1.5))
        # The softcap of flash-attn's interface runs inside the kernel; flex's row is the same math as a general
        # score_mod (called per tile, the backward through autograd) and is shown without a target.
        out.append(Target("b. flash_attn_func softcap <= 1.3 x plain flash", CASES[1], pass_, "flash_attn_func softcap",
                          "flash plain", 1.3))
        for case in DENSE:
            limit = 1.2 if case in UNSTRUCTURED else 0.7 if case in HIDING and pass_ == "forward" else 1.0
            for impl in ("flash", "reference"):
                out.append(Target(f"{case}: {impl} <= {limit:g} x SDPA", case, pass_, impl, "sdpa", limit))
        for case in (WINDOW, DOCS):
            out.append(Target(f"{case}: dense bool <= 1.25 x structured", case, pass_, "flash dense bool",
                              "flash structured", 1.25))
        out.append(Target("e. varlen 5x faster than SDPA", VARLEN, pass_, "flash_attn_varlen_func", "sdpa block-diagonal", 0.2))
    return out


def time_case(case: Case, inputs: dict, rounds: int) -> None:
    """Median ms per implementation, interleaved in a rotating order; round 0 warms up and gives the diffs."""
    backward = case.pass_ == "fwd+bwd"
    qkv, grad_out = inputs[case.pass_]
    names = list(case.impls)
    times, first = {name: [] for name in names}, {}
    for r in range(rounds + 1):
        for name in names[r % len(names):] + names[: r % len(names)]:
            seconds, result = run_once(case.impls[name], qkv, grad_out, {}, backward)
            if r:
                times[name].append(seconds)
            else:
                first[name] = result
    for name in names:
        case.ms[name] = statistics.median(times[name]) * 1e3
        if case.checks.get(name) in first:
            case.diff[name] = max_diff(first[name], first[case.checks[name]])


def evaluate(goals: list[Target], cases: list[Case]) -> None:
    by_key = {(c.name, c.pass_): c for c in cases}
    for goal in goals:
        case = by_key[(goal.case, goal.pass_)]
        missing = [i for i in (goal.ours, goal.peer) if i not in case.ms]
        if missing:
            goal.why_na = "; ".join(f"{i}: {case.na.get(i, 'not timed')}" for i in missing)
        else:
            goal.value = case.ms[goal.ours] / case.ms[goal.peer]


def tables(cases, goals, setup) -> list[tuple[str, list[str], list[list[str]]]]:
    """[(title, columns, rows)], shared by the console and the markdown page."""
    target_rows = [[g.label, g.pass_, "n/a" if g.value is None else f"{g.value:.2f}", f"<= {g.limit:.2f}",
                    g.verdict if g.value is not None else f"n/a ({g.why_na})"] for g in goals]
    setup_rows = [[k, str(v)] for k, v in setup.items()]
    rows = []
    for c in cases:
        peer = next(iter(c.impls))
        for name in list(c.impls) + list(c.na):
            if name in c.na:
                rows.append([c.name, c.pass_, name, "n/a", "", c.na[name]])
                continue
            diff = f"{c.diff[name]:.1e} vs {c.checks[name]}" if name in c.diff else ""
            rows.append([c.name, c.pass_, name, f"{c.ms[name]:.1f}", f"{c.ms[name] / c.ms[peer]:.2f}", diff])
    return [("Targets (time ratio ours / peer; below 1 is faster)", ["target", "pass", "ratio", "target", "verdict"], target_rows),
            ("Setup (not in the timed calls)", ["what", "value"], setup_rows),
            ("Every measurement (median ms; x peer: the time ratio to the case's first row)",
             ["case", "pass", "implementation", "median ms", "x peer", "max |diff|"], rows)]


def print_tables(header: list[str], parts) -> None:
    print("\n".join(header))
    for title, columns, rows in parts:
        widths = [max(len(x) for x in [name] + [r[i] for r in rows]) for i, name in enumerate(columns)]
        print(f"\n{title}")
        for row in [columns] + rows:
            print("  ".join(x.rjust(w) if is_number(x) else x.ljust(w) for x, w in zip(row, widths)).rstrip())


def write_markdown(path, header, parts, command, plot_path) -> None:
    lines = ["# FlexAttention, softcap, dense masks and varlen against PyTorch (CPU)", "",
             "Written by `bench/flex.py` (issue 18's speed targets); rerun with", "", f"    .venv/bin/python {command}", "",
             ("Batch 1, 8 heads, head dim 64, float32. \"forward\" runs on inputs without requires_grad; \"fwd+bwd\" "
             "backpropagates a random dO. Within a case the implementations run interleaved round by round after a "
             "warm-up round; times are medians. Ratios are times, ours / peer: below 1 is faster. PyTorch 2.13's "
             "FlexAttention has no backward on the CPU, so its fwd+bwd cells say n/a; its first call (the compilation) "
             "and the block masks' creation are timed apart from the calls."), "", *[f"{line}  " for line in header]]
    if plot_path:
        lines += ["", f"![ratios against targets]({os.path.relpath(plot_path, os.path.dirname(os.path.abspath(path)))})"]
    for title, columns, rows in parts:
        lines += ["", f"## {title}", "", "| " + " | ".join(columns) + " |",
                  "|" + "|".join("---:" if any(is_number(r[i]) for r in rows) else "---" for i in range(len(columns))) + "|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


def write_plot(path, goals, title) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    shown = [g for g in goals if g.value is not None]
    fig = Figure(figsize=(10, 0.32 * len(shown) + 1.6), layout="constrained")
    ax = fig.subplots()
    y = range(len(shown))
    colors = ["tab:blue" if g.verdict == "pass" else "tab:red" for g in shown]
    ax.barh(list(y), [g.value for g in shown], color=colors)
    ax.scatter([g.limit for g in shown], list(y), marker="|", s=200, color="black", label="target (at most)", zorder=3)
    ax.set_yticks(list(y), [f"{g.label} ({g.pass_})" for g in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("time ratio ours / peer (log; below 1 is faster; blue meets the target, red misses it)")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--window", type=int, default=255, help="keys on each side of the sliding window (d)")
    parser.add_argument("--quick", action="store_true", help="N = 256, window 15, 1 round; writes no page unless asked")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile(flex_attention) (its cells say n/a)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--markdown", metavar="PATH")
    parser.add_argument("--plot", metavar="PATH")
    parser.add_argument("--write-docs", action="store_true", help="= --markdown docs/flex-bench.md --plot docs/flex-bench.png")
    args = parser.parse_args()
    if args.quick:
        args.n, args.rounds, args.window = 256, 1, 15
    if args.n < DOCUMENTS or args.n % DOCUMENTS or args.rounds < 1 or args.window < 0:
        parser.error(f"--n must be a positive multiple of {DOCUMENTS}, --rounds positive, --window >= 0")
    if args.write_docs:
        args.markdown = args.markdown or os.path.join(ROOT, "docs", "flex-bench.md")
        args.plot = args.plot or os.path.join(ROOT, "docs", "flex-bench.png")
    for path in (args.json, args.markdown, args.plot):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"no folder for {path}")
    torch.set_num_threads(args.threads)
    started, load_before = time.time(), loadavg()
    inputs = {pass_: make_inputs(args.n, pass_ == "fwd+bwd") for pass_ in ("forward", "fwd+bwd")}
    cases, setup = build_cases(args.n, args.window, inputs, compile_flex=not args.no_compile)
    for case in cases:
        time_case(case, inputs, args.rounds)
        print(f"  {time.time() - started:5.0f} s: timed {case.name}, {case.pass_}", file=sys.stderr, flush=True)
    goals = targets()
    evaluate(goals, cases)
    command = "bench/flex.py " + " ".join(sys.argv[1:])
    header = [describe().line(), (f"torch {torch.__version__}, {args.threads} threads, float32, batch 1, {HEADS} heads, head dim {D_HEAD}, "
              f"N = {args.n}, window {args.window} each side, {DOCUMENTS} sequences of {args.n // DOCUMENTS}; "
              f"median of {args.rounds} interleaved rounds"),
              (f"load average {load_before} at start, {loadavg()} at end ({os.cpu_count()} CPUs); "
              f"run took {(time.time() - started) / 60:.1f} min; command: {command}")]
    parts = tables(cases, goals, setup)
    print_tables(header, parts)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"header": header, "setup": setup,
                       "cases": [{"case": c.name, "pass": c.pass_, "ms": c.ms, "max_diff": c.diff, "n/a": c.na} for c in cases],
                       "targets": [{"label": g.label, "pass": g.pass_, "ratio": g.value, "limit": g.limit,
                                    "verdict": g.verdict, "why_na": g.why_na} for g in goals]}, out, indent=1)
    if args.markdown:
        write_markdown(args.markdown, header, parts, command, args.plot)
    if args.plot:
        write_plot(args.plot, goals, f"bench/flex.py: N = {args.n}, {args.threads} threads, torch {torch.__version__}, "
                                     f"median of {args.rounds}")


if __name__ == "__main__":
    main()
