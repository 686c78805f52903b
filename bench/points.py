"""Do the intervention points cost anything when no hook is set? This tree against an earlier commit.

    .venv/bin/python bench/points.py                  # against the commit before the points landed
    .venv/bin/python bench/points.py --base HEAD~3 --rounds 7

The earlier commit's ``src/`` is written to a temporary folder (``git archive``), and each
workload (bench/revisions.py's, which runs them) runs in a fresh process with one tree or
the other first on ``PYTHONPATH``, alternating A B A B so that a machine's slow minute falls on both. In each process the
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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import revisions  # noqa: E402

BASE = "1bae9e8"  # main before the intervention points

# bench/revisions.py's workloads under the names this page has always printed
WORKLOADS = {"generate": revisions.WORKLOADS["generate"], "forward": revisions.WORKLOADS["models"],
             "train": revisions.WORKLOADS["train"], "ablate": revisions.WORKLOADS["points"]}


if __name__ == "__main__":
    revisions.main(WORKLOADS, BASE, __doc__)
