"""Tables and the plot for bench/attention.py: plain text, markdown, and a PNG (matplotlib, Agg).

Reads the measured cases only; it never runs attention.
"""

from __future__ import annotations

import os


def _mask(case) -> str:
    return "causal" if case.causal else "none"


def _short_skip(reason: str) -> str:
    """'skipped (needs 17.2 GB)' -> 'needs 17.2 GB' for narrow cells."""
    return reason.removeprefix("skipped (").rstrip(")").split("; ")[-1]


def _ratio_cell(case, impl) -> str:
    if impl in case.skipped:
        return _short_skip(case.skipped[impl])
    return f"{case.ms[impl] / case.ms['sdpa']:.2f}x"


def _memory_cell(case, impl) -> str:
    if impl in case.skipped:
        return _short_skip(case.skipped[impl])
    if impl not in case.peak_mb:
        return "-"
    return "failed" if case.peak_mb[impl] is None else f"{case.peak_mb[impl]:.0f}"


def header_lines(meta) -> list[str]:
    return [
        meta.get("machine", "machine not recorded"),
        f"torch {meta['torch']}, {meta['threads']} threads, float32, batch 1, 8 heads, head dim 64; "
        f"median of rounds: {meta['rounds']}",
        f"{meta['load']}; run took {meta['minutes']:.1f} min; memory budget for the N x N forms "
        f"{meta['budget_gb']:.1f} GB",
    ]


def summary_rows(cases, impls, cell):
    """(N, mask, pass, sdpa ms, one cell per other implementation) for each case."""
    others = [i for i in impls if i != "sdpa"]
    return [[str(c.n), _mask(c), c.pass_, f"{c.ms['sdpa']:.1f}"] + [cell(c, i) for i in others] for c in cases]


def detail_rows(cases, impls):
    rows = []
    for c in cases:
        for impl in impls:
            if impl in c.skipped:
                rows.append([str(c.n), _mask(c), c.pass_, impl, c.skipped[impl], "", "", "", ""])
                continue
            ms = c.ms[impl]
            peak = _memory_cell(c, impl)
            gflops = c.flops / (ms * 1e-3) / 1e9
            rows.append([str(c.n), _mask(c), c.pass_, impl, f"{ms:.1f}", f"{ms / c.ms['sdpa']:.2f}x",
                         f"{gflops:.0f}", peak, f"{c.diff[impl]:.1e}"])
    return rows


def mask_case_rows(mask_rows):
    return [[name, c.pass_, f"{c.ms['sdpa']:.1f}", f"{c.ms['flash'] / c.ms['sdpa']:.2f}x",
             f"{c.ms['reference'] / c.ms['sdpa']:.2f}x", f"{max(c.diff['flash'], c.diff['reference']):.1e}"]
            for name, c in mask_rows]


def tables(cases, mask_rows, impls):
    """[(title, column names, rows)], shared by the text and markdown outputs."""
    others = [i for i in impls if i != "sdpa"]
    out = [
        ("Time, median, as a ratio to SDPA (lower is faster)", ["N", "mask", "pass", "sdpa ms"] + [f"{i} / sdpa" for i in others],
         summary_rows(cases, impls, _ratio_cell)),
    ]
    if any(c.peak_mb for c in cases):
        out.append(("Peak memory, MB above the inputs (fresh process per cell)",
                    ["N", "mask", "pass", "sdpa MB"] + [f"{i} MB" for i in others],
                    [[*row[:3], _memory_cell(c, "sdpa"), *row[4:]] for row, c in
                     zip(summary_rows(cases, impls, _memory_cell), cases)]))
    out.append(("Every measurement (GFLOP/s counts useful work: 4 N^2 d H forward, half causal, x3.5 fwd+bwd)",
                ["N", "mask", "pass", "impl", "median ms", "x sdpa", "GFLOP/s", "peak MB", "max |diff| vs sdpa"],
                detail_rows(cases, impls)))
    if mask_rows:
        out.append(("Other masks (small cases): flash and reference against SDPA",
                    ["case", "pass", "sdpa ms", "flash / sdpa", "reference / sdpa", "max |diff|"],
                    mask_case_rows(mask_rows)))
    return out


def print_tables(cases, mask_rows, impls, meta) -> None:
    print("\n".join(header_lines(meta)))
    for title, columns, rows in tables(cases, mask_rows, impls):
        widths = [max(len(x) for x in [name] + [r[i] for r in rows]) for i, name in enumerate(columns)]
        print(f"\n{title}")
        for row in [columns] + rows:
            cells = [x.ljust(w) if i < 4 and not x[:1].isdigit() else x.rjust(w) for i, (x, w) in enumerate(zip(row, widths))]
            print("  ".join(cells).rstrip())


def write_markdown(path, cases, mask_rows, impls, meta, plot_path=None) -> None:
    lines = [
        "# Flash attention against PyTorch's SDPA (CPU)",
        "",
        "Written by `bench/attention.py`; rerun with",
        "",
        f"    .venv/bin/python {meta['command']}",
        "",
        "`sdpa` is `torch.nn.functional.scaled_dot_product_attention` (its CPU flash kernel), "
        "`flash` is `selfattn.flash_attention`, `naive` is softmax(q k^T * scale (+ causal mask)) v "
        "in plain torch, `reference` is `selfattn.scaled_dot_product_attention` (our oracle, which "
        "builds the N x N matrix). \"forward\" runs on inputs without requires_grad; \"fwd+bwd\" "
        "backpropagates a random dO. The implementations are interleaved round by round in the same "
        "run; ratios are against SDPA's median in that run. Peak memory is measured once per cell "
        "in a fresh process: peak resident memory minus resident memory after creating the inputs.",
        "",
        *[f"{line}  " for line in header_lines(meta)],
    ]
    if plot_path:
        lines += ["", f"![time and memory against N]({os.path.relpath(plot_path, os.path.dirname(os.path.abspath(path)))})"]
    for title, columns, rows in tables(cases, mask_rows, impls):
        lines += ["", f"## {title}", "", "| " + " | ".join(columns) + " |",
                  "|" + "|".join("---" if i < 3 else "---:" for i in range(len(columns))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


COLORS = {"sdpa": "black", "flash": "tab:blue", "naive": "tab:red", "reference": "tab:orange"}


def write_plot(path, cases, impls, meta) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    lengths = sorted({c.n for c in cases})
    fig = Figure(figsize=(15, 9), layout="constrained")
    axes = fig.subplots(2, 3)
    for row, causal in enumerate((False, True)):
        panels = [(axes[row][0], "forward", "ms"), (axes[row][1], "fwd+bwd", "ms"), (axes[row][2], None, "peak MB")]
        for ax, pass_, unit in panels:
            for impl in impls:
                color = COLORS.get(impl)
                for p, style in ((pass_, "-"),) if pass_ else (("fwd+bwd", "-"), ("forward", "--")):
                    chosen = [c for c in cases if c.causal == causal and c.pass_ == p]
                    values = [(c.n, (c.ms if unit == "ms" else c.peak_mb).get(impl)) for c in chosen]
                    points = [(n, v) for n, v in values if v]
                    if points:
                        label = impl if (pass_ or style == "-") else None
                        ax.plot(*zip(*points), style, marker="o", color=color, label=label)
            mask = "causal" if causal else "no mask"
            ax.set_title(f"{pass_ or 'peak memory (solid fwd+bwd, dashed forward)'}, {mask}", fontsize=10)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(lengths, [f"{n // 1024}k" if n >= 1024 else str(n) for n in lengths])
            ax.set_xlabel("sequence length N")
            ax.set_ylabel("median ms" if unit == "ms" else "MB above inputs")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"Attention on CPU, float32, batch 1, 8 heads, d 64 (torch {meta['torch']}, {meta['threads']} threads)")
    fig.savefig(path, dpi=100)
