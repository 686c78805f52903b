"""Every benchmark's work at two revisions in one run: did a change of the house cost speed?

    .venv/bin/python bench/revisions.py                    # against main before issue 45's first move
    .venv/bin/python bench/revisions.py --base HEAD~5 --rounds 7 attention models

A refactor must not move any benchmark's figure. Rerunning each benchmark twice would take
most of an hour and compare two runs minutes apart; instead each benchmark's headline work
is one workload below, run at the earlier commit and at this tree in fresh processes, A B
A B, so that a slow minute of the machine falls on both. The earlier commit's ``src/`` is
written to a temporary folder (``git archive``) and put first on ``PYTHONPATH``. In each
process the workload is warmed up once and timed several times (the median); the table
gives the median over rounds and the ratio this tree / the base (1.00: the same). Two runs
of one tree on these 2-core machines differ by up to about 5% on the smaller workloads.
The workloads use the public names (``selfattn.*``) only, so that both trees run them.

    workload    stands for                 what it runs
    attention   attention.py, summary.py,  flash_attention, causal, N 2048, 8 heads, d 64: forward
                busy.py, kernel_ab.py
    backward    the same, fwd+bwd          the same call and its backward
    masks       attention_masks.py         flash_attention with a sliding-window mask (W 256), N 2048
    flex        flex.py                    flex_attention with a tanh softcap score_mod, N 1024
    models      models.py                  SmolLM2-135M-Instruct, one forward over 256 tokens
    generate    models.py (stories260K)    stories260K, 64 greedy tokens
    minilm      minilm.py                  all-MiniLM-L6-v2 on 8 sentences of about 64 tokens
    train       train.py                   a 4-layer Transformer (d 64): 4 x (forward, backward) on 8 x 128
    points      points.py                  tiny-induction: patch_heads over every head
    live        live.py, live_load.py      the live app (FastAPI's test client): POST /api/attention,
                                           stories260K, one head
    startup     startup.py                 a new process: `python -m selfattn explain --format json`
    ring        ring.py                    the ring demo on 2 processes (torchrun), N 1024

bench/gpu.py needs a GPU and is not among them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = "ba3839a"  # main before issue 45's first move

_QKV = """
import torch, selfattn as sa
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 8, {n}, 64, generator=g) for _ in range(3))
"""
WORKLOADS = {
    "attention": _QKV.format(n=2048) + """
def work():
    with torch.no_grad():
        sa.flash_attention(q, k, v, is_causal=True)
""",
    "backward": _QKV.format(n=2048) + """
q, k, v = (t.requires_grad_() for t in (q, k, v))
def work():
    sa.flash_attention(q, k, v, is_causal=True).sum().backward()
""",
    "masks": _QKV.format(n=2048) + """
mask = sa.sliding_window_mask(2048, 2048, left=255)
def work():
    with torch.no_grad():
        sa.flash_attention(q, k, v, attn_mask=mask)
""",
    "flex": _QKV.format(n=1024) + """
softcap = lambda score, b, h, i, j: 30.0 * torch.tanh(score / 30.0)
def work():
    with torch.no_grad():
        sa.flex_attention(q, k, v, score_mod=softcap)
""",
    "models": """
import torch, selfattn as sa
m = sa.load_pretrained("SmolLM2-135M-Instruct")
enc = m.tokenize(torch.randint(0, 49152, (1, 256), generator=torch.Generator().manual_seed(0)))
def work():
    with torch.no_grad():
        m.run(enc, last_only=True)
""",
    "generate": """
import selfattn as sa
m = sa.load_pretrained("stories260K")
work = lambda: m.generate("Once upon a time", 64)
""",
    "minilm": """
import torch, selfattn as sa
m = sa.load_pretrained("all-MiniLM-L6-v2")
texts = [" ".join(["The cat sat on the warm mat"] * 9)] * 8
def work():
    with torch.no_grad():
        m(texts)
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
    "points": """
import selfattn as sa
m = sa.load_pretrained("tiny-induction")
work = lambda: sa.patch_heads(m, "abcdefghijklmnopabcdefghij", "abcdefghijklmnopabcdefghiw", "k")
""",
    "live": """
from fastapi.testclient import TestClient
from selfattn.commands.live import LiveModels
from selfattn.serve.app import create_app
client = TestClient(create_app(LiveModels()))
body = {"model": "stories260K", "text": "Once upon a time there was a cat", "layer": 0, "head": 0}
def work():
    assert client.post("/api/attention", json=body).status_code == 200
""",
    "startup": """
import subprocess, sys
def work():
    subprocess.run([sys.executable, "-m", "selfattn", "explain", "--format", "json"], check=True, capture_output=True)
""",
    "ring": """
import os, subprocess, sys
from pathlib import Path
torchrun = str(Path(sys.executable).with_name("torchrun"))
command = [torchrun, "--standalone", "--nproc_per_node=2", "-m", "selfattn.distributed.demo", "--seq-len", "1024"]
def work():
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
""",
}
TIMER = """
import statistics, time
work()
seconds = []
for _ in range({repeats}):
    start = time.perf_counter(); work(); seconds.append(time.perf_counter() - start)
print(statistics.median(seconds))
"""


def base_tree(commit: str, into: Path) -> Path:
    """The commit's src/ written under ``into``; its path (for PYTHONPATH).

    Args:
        commit: a revision git knows.
        into: an empty folder.

    Returns:
        The folder holding that revision's ``selfattn`` package.
    """
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, "src"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def timed(source: Path, script: str, repeats: int) -> float:
    """Median seconds of a workload's ``work()`` in a fresh process with ``source`` first on the path.

    Args:
        source: the folder holding the ``selfattn`` package to run.
        script: Python that defines ``work()``.
        repeats: timed calls after one warm-up call.

    Returns:
        The median of the timed calls, in seconds.
    """
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", script + TIMER.format(repeats=repeats)], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"failed on {source}: {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def compare(workloads: dict[str, str], names: list[str], base: str, rounds: int, repeats: int) -> None:
    """Print each workload's median at this tree and at ``base`` and their ratio, A B A B.

    Args:
        workloads: name -> Python defining ``work()``.
        names: the workloads to run, in order.
        base: the revision to compare with.
        rounds: A B rounds per workload.
        repeats: timed calls in each process.
    """
    print(f"{machine_line()}; base {base}; {rounds} rounds x {repeats} runs, medians", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        old_tree = base_tree(base, Path(folder))
        here = ROOT / "src"
        print(f"{'workload':10} {'this tree':>12} {'base':>12} {'ratio':>7}", flush=True)
        for name in names:
            new, old = [], []
            for round_ in range(rounds):
                pair = [(new, here), (old, old_tree)]
                for times, tree in pair if round_ % 2 == 0 else reversed(pair):
                    times.append(timed(tree, workloads[name], repeats))
            a, b = statistics.median(new), statistics.median(old)
            print(f"{name:10} {a * 1000:9.2f} ms {b * 1000:9.2f} ms {a / b:7.3f}", flush=True)


def main(workloads: dict[str, str] = WORKLOADS, base: str = BASE, doc: str = __doc__) -> None:
    """The command line: ``--base``, ``--rounds``, ``--repeats`` and the workloads to run (default all).

    Args:
        workloads: name -> Python defining ``work()`` (bench/points.py passes its own).
        base: the default revision to compare with.
        doc: the script's docstring, whose first line is the help's description.
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--base", default=base, help=f"the commit to compare with (default {base})")
    parser.add_argument("--rounds", type=int, default=5, help="A B rounds per workload (default 5)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs inside each process (default 5)")
    parser.add_argument("workloads", nargs="*", help=f"some of {', '.join(workloads)} (default: all)")
    args = parser.parse_args()
    unknown = [w for w in args.workloads if w not in workloads]
    if unknown:
        parser.error(f"no workload {unknown[0]!r}: they are {', '.join(workloads)}")
    compare(workloads, args.workloads or list(workloads), args.base, args.rounds, args.repeats)


if __name__ == "__main__":
    main()
