"""Do the intervention points cost anything when no hook is set? This tree against an earlier commit.

    .venv/bin/python bench/points.py                  # against the commit before the points landed
    .venv/bin/python bench/points.py --base HEAD~3 --rounds 7

The earlier commit's ``src/`` is written to a temporary folder (``git archive``), and each
workload runs in a fresh process with one tree or the other first on ``PYTHONPATH``,
alternating A B A B so that a machine's slow minute falls on both. In each process the
workload is warmed up once and timed several times (the median); the table gives the
median over rounds and the ratio this tree / the base (1.00: the same). Two runs of the
same tree on these 2-core machines differ by up to about 5% on the smaller workloads.

    generate   stories260K, 64 greedy tokens from "Once upon a time" (many small calls:
               the per-call overhead shows here first)
    forward    SmolLM2-135M-Instruct, one forward over 256 tokens, logits of the last
    train      a 4-layer Transformer (d 64, 4 heads) on 8 x 128 tokens: 4 x (forward, backward)
    ablate     tiny-induction: patch_heads over every head (hooks set: the named points
               against the forward pre-hooks on W_o they replaced)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402
from revisions import base_tree  # noqa: E402
from revisions import timed as timed_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = "1bae9e8"  # main before the intervention points

WORKLOADS = {
    "generate": """
import selfattn as sa
m = sa.load_pretrained("stories260K")
work = lambda: m.generate("Once upon a time", 64)
""",
    "forward": """
import torch, selfattn as sa
m = sa.load_pretrained("SmolLM2-135M-Instruct")
ids = torch.randint(0, 49152, (1, 256), generator=torch.Generator().manual_seed(0))
enc = m.tokenize(ids)
def work():
    with torch.no_grad():
        m.run(enc, last_only=True)
""",
    "train": """
import torch, selfattn as sa
torch.manual_seed(0)
net = sa.Transformer(sa.TransformerConfig(d_model=64, n_heads=4, n_layers=4, causal=True))
x = torch.randn(8, 128, 64)
def work():
    for _ in range(4):
        net.zero_grad()
        net(x).last_hidden_state.square().mean().backward()
""",
    "ablate": """
import selfattn as sa
m = sa.load_pretrained("tiny-induction")
work = lambda: sa.patch_heads(m, "abcdefghijklmnopabcdefghij", "abcdefghijklmnopabcdefghiw", "k")
""",
}
def timed(source: Path, workload: str, repeats: int) -> float:
    """Median seconds of the workload in a fresh process with ``source`` first on the path."""
    return timed_script(source, WORKLOADS[workload], repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE, help=f"the commit to compare with (default {BASE})")
    parser.add_argument("--rounds", type=int, default=5, help="A B rounds per workload (default 5)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs inside each process (default 5)")
    parser.add_argument("workloads", nargs="*", help=f"some of {', '.join(WORKLOADS)} (default: all)")
    args = parser.parse_args()
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"no workload {unknown[0]!r}: they are {', '.join(WORKLOADS)}")
    print(f"{machine_line()}; base {args.base}; {args.rounds} rounds x {args.repeats} runs, medians")
    with tempfile.TemporaryDirectory() as folder:
        base = base_tree(args.base, Path(folder))
        here = ROOT / "src"
        print(f"{'workload':10} {'this tree':>12} {'base':>12} {'ratio':>7}")
        for workload in args.workloads or WORKLOADS:
            new, old = [], []
            for _ in range(args.rounds):
                new.append(timed(here, workload, args.repeats))
                old.append(timed(base, workload, args.repeats))
            a, b = statistics.median(new), statistics.median(old)
            print(f"{workload:10} {a * 1000:9.2f} ms {b * 1000:9.2f} ms {a / b:7.3f}")


if __name__ == "__main__":
    main()
