"""What bench/gpu.py prints and writes: the progress, the header, the table, the notes, the markdown page."""

from __future__ import annotations

import sys
import time

import torch

from gpu_cases import DOCUMENTS, FLOP_NOTE, SHORT, Row, State, last_backend, short_error
from machine import machine_line


class Progress:
    """A rich bar on stderr in a terminal, plain lines when piped; either way a line per step."""

    def __init__(self, total: int) -> None:
        self.started, self.bar = time.time(), None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

            self.bar = Bar(TextColumn("bench/gpu.py"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TextColumn("{task.description}"), console=Console(file=sys.stderr), transient=True,
                           redirect_stdout=sys.stdout.isatty())  # stdout to a file must keep its lines
            self.bar.start()
            self.task = self.bar.add_task("", total=total)

    def step(self, text: str) -> None:
        if self.bar is None:
            print(f"  {time.time() - self.started:5.0f} s  {text}", file=sys.stderr, flush=True)
        else:
            self.bar.console.print(text, highlight=False)
            self.bar.update(self.task, advance=1, description=text.split(":")[0])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def number(x: float | None, ratio: bool = False) -> str:
    if x is None:
        return "n/a"
    if ratio:
        return f"{x:.2f}"
    return f"{x:.3g}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def summary(row: Row) -> str:
    peers = ", ".join(f"{name} {number(p['ms'])}" for name, p in row.peers.items() if "ms" in p)
    return (f"{row.dtype} {row.mask} N={row.n} {row.pass_}: ours {number(row.ours_ms)} ms "
            f"({number(row.ours_tflops)} TFLOP/s); {peers or 'no peer'}")


def table(rows: list[Row], peers: list[str]) -> tuple[list[str], list[list[str]]]:
    columns = ["dtype", "mask", "N", "batch", "pass", "ours ms", "TFLOP/s"] + [x for p in peers for x in (f"{p} ms", "ratio")]
    cells = []
    for r in rows:
        line = [r.dtype, r.mask, str(r.n), str(r.batch), r.pass_, number(r.ours_ms), number(r.ours_tflops)]
        for name in peers:
            p = r.peers[name]
            line += [number(p.get("ms")), number(p.get("ratio"), ratio=True) if "ms" in p else ""]
        cells.append(line)
    return columns, cells


def print_table(columns: list[str], cells: list[list[str]]) -> None:
    right = [i >= 2 and i != 4 for i in range(len(columns))]
    widths = [max(len(x) for x in [name] + [line[i] for line in cells]) for i, name in enumerate(columns)]
    if sys.stdout.isatty():
        from rich import box
        from rich.console import Console
        from rich.table import Table

        shown = Table(box=box.SIMPLE)
        for name, numeric, width in zip(columns, right, widths):
            shown.add_column(name, justify="right" if numeric else "left", no_wrap=True, min_width=width)
        for line in cells:
            shown.add_row(*line)
        natural = sum(w + 3 for w in widths) + 4  # a narrower terminal wraps the lines rather than rich cutting cells to "…"
        Console(width=max(Console().width, natural)).print(shown)
        return
    for line in [columns] + cells:
        print("  ".join(x.rjust(w) if r else x.ljust(w) for x, w, r in zip(line, widths, right)).rstrip())


def notes(rows: list[Row], checks: list[dict], passed: bool) -> list[str]:
    """Why cells say n/a (once per reason), then what must not be missed: failed checks, ours not on Triton."""
    seen: dict = {}
    for r in rows:
        why = {name: p["n/a"] for name, p in r.peers.items() if "n/a" in p}
        for name, reason in (({"ours": r.ours_error} if r.ours_error else {}) | why).items():
            seen.setdefault((name, reason), set()).add(r.mask)
    lines = [f"n/a  {name}: {why} ({', '.join(sorted(masks))})" for (name, why), masks in seen.items()]
    lines += [f"!! check FAILED: {c['side']}, {c['mask']}: max |diff| {c['max_diff']} over tolerance {c['tolerance']}"
              for c in checks if c.get("passed") is False]
    elsewhere = sorted({r.ours_backend for r in rows if r.ours_backend not in (None, "triton")})
    if elsewhere:
        lines.append(f"!! ours ran on {', '.join(elsewhere)}, NOT triton, in some rows: not the Triton kernel's figures")
    return lines + ([] if passed else ["!! ours did not pass every correctness check: its figures are of a wrong result"])


def header(state: State) -> list[str]:
    grid = state.grid
    if state.cuda:
        p = torch.cuda.get_device_properties(0)
        gpu = (f"GPU: {p.name}, capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB, "
               f"{p.multi_processor_count} SMs; CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    else:
        gpu = "GPU: none: --interpret runs our Triton kernel in Triton's interpreter on CPU tensors; the times mean nothing"
    versions = []
    for module in ("triton", "flash_attn"):
        try:
            versions.append(f"{module.replace('_', '-')} {__import__(module).__version__}")
        except ImportError:
            versions.append(f"{module.replace('_', '-')} not installed")
    return [gpu, f"CPU: {machine_line()}", f"versions: torch {torch.__version__}, {', '.join(versions)}", ours_line(state),
            (f"grid: N = {', '.join(map(str, grid.sizes))}; batch x N = {grid.tokens} tokens, {grid.heads} heads, "
             f"d = {grid.head_dim}; {', '.join(SHORT[d] for d in grid.dtypes)}; masks {', '.join(grid.masks)} "
             f"(window {grid.window} keys, {DOCUMENTS} documents per sequence); forward and fwd+bwd; "
             f"medians of {grid.rounds} interleaved rounds"), FLOP_NOTE]


def ours_line(state: State) -> str:
    """Which backend one small call of ours actually ran on: triton, or loudly not."""
    grid = state.grid
    q = torch.randn(1, grid.heads, 128, grid.head_dim, device=grid.device, dtype=grid.dtypes[0])
    try:
        state.sa.flash_attention(q, q, q, is_causal=True, backend="triton")
    except Exception as error:
        return f"!! ours: selfattn.flash_attention(..., backend=\"triton\") FAILED: {short_error(error)}"
    state.ours_backend = last_backend()
    if state.ours_backend != "triton":
        return f"!! ours: selfattn.flash_attention(..., backend=\"triton\") ran on {state.ours_backend}, NOT triton"
    return "ours: selfattn.flash_attention(..., backend=\"triton\") ran on triton" + ("" if state.cuda else " (interpreted)")


def write_markdown(path: str, lines: list[str], columns: list[str], cells: list[list[str]], extra: list[str]) -> None:
    text = ["# Our Triton flash attention against SDPA, FlexAttention and flash-attn (GPU)", "",
            "Written by `bench/gpu.py`; rerun with", "", f"    .venv/bin/python {' '.join(['bench/gpu.py'] + sys.argv[1:])}",
            "", *[f"{line}  " for line in lines], "", "| " + " | ".join(columns) + " |",
            "|" + "|".join("---" if i in (0, 1, 4) else "---:" for i in range(len(columns))) + "|"]
    text += ["| " + " | ".join(line) + " |" for line in cells] + [""] + [f"- {line}" for line in extra]
    with open(path, "w") as out:
        out.write("\n".join(text) + "\n")
