"""bench/gpu.py runs end to end on a CPU in its smoke mode, and without a GPU says so in one line.

--interpret runs our Triton kernel in Triton's interpreter on CPU tensors, with SDPA's CPU kernel
and eager FlexAttention standing in for the GPU peers; its times mean nothing. What is checked:
exit status 0, a row for every mask and pass with our median, ratios that follow from the medians,
FLOPs and TFLOP/s that follow from the formula and the visible pairs (counted here from the dense
masks, not with the script's closed forms), our kernel reported as the one that ran, and the
correctness check passed for every mask.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from selfattn.masks import causal_mask, document_mask, sliding_window_mask

ROOT = Path(__file__).resolve().parent.parent
MASKS = {"causal", "window", "documents"}


def run_bench(*arguments: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/gpu.py", *arguments], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def dense_pairs(row: dict) -> int:
    """The pairs the row's mask lets through, summed over the dense bool mask."""
    n = row["n"]
    if row["mask"] == "causal":
        mask = causal_mask(n)
    elif row["mask"] == "window":
        mask = sliding_window_mask(n, left=row["window"] - 1)  # a causal window of `window` keys
    else:
        assert sum(row["document_lengths"]) == n
        mask = causal_mask(n) & document_mask(row["document_lengths"])
    return int(mask.sum())


def test_interpreted_quick_run_reports_every_mask_and_pass(tmp_path):
    pytest.importorskip("triton", reason="--interpret runs our kernel in Triton's interpreter; CI installs triton")
    out = tmp_path / "gpu.json"
    done = run_bench("--interpret", "--quick", "--json", str(out), timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first = done.stdout.splitlines()[:4]
    assert first[0].startswith("GPU: none") and first[1].startswith("CPU: ") and "triton" in first[2], first
    assert first[3].startswith("ours:") and first[3].endswith("ran on triton (interpreted)"), first
    result = json.loads(out.read_text())
    assert result["ours_backend"] == "triton"
    rows = result["rows"]
    assert {(r["mask"], r["pass"]) for r in rows} == {(m, p) for m in MASKS for p in ("forward", "fwd+bwd")}
    for row in rows:
        assert row["ours_ms"] > 0 and row["ours_backend"] == "triton", row
        pairs = dense_pairs(row)
        assert row["visible_pairs"] == pairs, row
        forward = 4 * row["batch"] * row["heads"] * pairs * row["d"]
        assert math.isclose(row["flops"], forward * (3.5 if row["pass"] == "fwd+bwd" else 1.0)), row
        assert math.isclose(row["ours_tflops"], row["flops"] / (row["ours_ms"] * 1e-3) / 1e12), row
        timed = {name: p for name, p in row["peers"].items() if "ms" in p}
        assert "sdpa-cpu" in timed, row  # the CPU stand-in always runs
        for peer in timed.values():
            assert peer["ms"] > 0 and math.isclose(peer["ratio"], row["ours_ms"] / peer["ms"]), row
        for name, peer in row["peers"].items():
            assert "ms" in peer or peer["n/a"], (name, row)  # every peer timed or said why not
        assert set(row["peers"]["sdpa-flash"]) == {"n/a"} and set(row["peers"]["sdpa-cudnn"]) == {"n/a"}
    ours = [c for c in result["checks"] if c["side"] == "ours"]
    assert {c["mask"] for c in ours} == MASKS and all(c["passed"] for c in ours), ours
    assert all(set(c["max_diff"]) == {"out", "dq", "dk", "dv"} for c in ours)
    assert result["checks_passed"] is True
    stand_in = [c for c in result["checks"] if c["side"] == "sdpa-cpu"]
    assert len(stand_in) == len(MASKS) and all(c["passed"] for c in stand_in), stand_in


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: the no-GPU message cannot show")
def test_without_a_gpu_one_line_and_status_2():
    done = run_bench(timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    said = (done.stdout + done.stderr).strip()
    assert len(said.splitlines()) == 1 and "Traceback" not in said, said
    assert "needs a CUDA GPU" in said and "--interpret" in said, said
