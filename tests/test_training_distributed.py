"""`torchrun --nproc_per_node=2 -m selfattn train`: two gloo ranks give one process's loss curve.

Each rank takes half of every step's batch, DistributedDataParallel averages the
gradients and the loss is averaged over the ranks, so the run is the single process's up
to float32 rounding (a mean of two half-batch means instead of one mean). The single
process is the same settings trained here, on one thread as each rank is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from training_runs import CLI_SEED, CLI_STEPS, cli_env, read_lines, shared_run

pytestmark = pytest.mark.slow  # torchrun starts two ranks that train for real

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with the gloo backend", allow_module_level=True)

TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    launcher = [str(TORCHRUN)] if TORCHRUN.is_file() else [sys.executable, "-m", "torch.distributed.run"]  # the same tool
    folder = tmp_path_factory.mktemp("torchrun") / "run"
    # --standalone: a rendezvous on localhost at a free port, so parallel sessions do not collide.
    command = [*launcher, "--standalone", "--nproc_per_node=2", "-m", "selfattn", "train",
               "--steps", str(CLI_STEPS), "--out", str(folder), "--seed", str(CLI_SEED)]
    done = subprocess.run(command, capture_output=True, text=True, env=cli_env(), timeout=300, check=False)
    assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}"
    return folder, done.stdout


@pytest.fixture(scope="module")
def one_process():
    return shared_run("cli-defaults", steps=CLI_STEPS, seed=CLI_SEED)


def test_two_ranks_write_one_run(two_ranks):
    folder, out = two_ranks
    settings = json.loads((folder / "training.json").read_text(encoding="utf-8"))
    assert settings["world_size"] == 2 and settings["finished"] is True and settings["step"] == CLI_STEPS
    assert out.count(f"run {folder}: induction, step {CLI_STEPS} of {CLI_STEPS}") == 1  # rank 0 alone prints
    assert "2 process(es)" in out


def test_two_ranks_give_the_single_process_losses(two_ranks, one_process):
    folder, _ = two_ranks
    theirs, ours = read_lines(folder / "metrics.jsonl"), one_process.metrics
    assert [r["step"] for r in theirs] == [r["step"] for r in ours] == [25, 50, 75, 80]
    for key in ("train_loss", "val_loss"):
        got = torch.tensor([r[key] for r in theirs], dtype=torch.float64)
        expected = torch.tensor([r[key] for r in ours], dtype=torch.float64)
        # float32 rounding of the split batch, grown over 80 AdamW steps: measured 7e-8 relative at most.
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=0, msg=lambda m, key=key: f"{key}: {m}")
    a, b = load_file(folder / "model.safetensors"), load_file(one_process.folder / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        # AdamW divides by the gradient's running size, so a near-zero gradient entry turns its
        # rounding into up to lr-sized steps: measured 7e-6 at most, on weights of ~0.02 to 1.
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=5e-5, msg=lambda m, name=name: f"{name}: {m}")
