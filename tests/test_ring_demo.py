"""The ring-attention demo, run for real under torchrun, and the peak-memory helper it uses.

The demo checks itself against torch's scaled_dot_product_attention on rank 0 (the
independent reference); these tests hold it to that check's numbers, its output formats
and its errors. Each torchrun launch costs a few seconds, so there are three; errors that
are found before any process group exists run in this process.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest
import torch

from selfattn.distributed import demo
from selfattn.peak_memory import PeakMemory

TIMEOUT = 120
SMALL = ["--seq-len", "64", "--heads", "2", "--head-dim", "8"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
DEMO = ["-m", "selfattn.distributed.demo"]
CLEAR_REFS_WORKS = os.access("/proc/self/clear_refs", os.W_OK)
JSON_KEYS = {"world_size", "backend", "device", "threads_per_rank", "seq_len", "lengths", "layout", "batch", "heads",
             "head_dim", "dtype", "causal", "forward_only", "seed", "ranks", "max_diff", "forward_s", "fwd_bwd_s",
             "max_peak_bytes", "kv_held_bytes"}
RANK_KEYS = {"rank", "positions", "forward_s", "fwd_bwd_s", "peak_bytes", "memory", "sent_bytes"}


def launch(command: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env={**environment, **(env or {})})


def assert_peak(value) -> None:
    """A peak is bytes (it may be 0 on tiny inputs: freed memory gets reused), or None where unsupported."""
    if CLEAR_REFS_WORKS:
        assert isinstance(value, int) and value >= 0
    else:
        assert value is None


def test_torchrun_two_ranks_causal_json_matches_sdpa():
    done = launch(TORCHRUN + DEMO + SMALL + ["--causal", "--json"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout.strip().splitlines()) == 1  # one JSON object, from rank 0 only
    result = json.loads(done.stdout)
    assert set(result) == JSON_KEYS
    assert (result["world_size"], result["lengths"], result["layout"], result["causal"]) == (2, [32, 32], "zigzag", True)
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    for stats in result["ranks"]:
        assert set(stats) == RANK_KEYS
        assert stats["positions"] == 32 and stats["forward_s"] > 0 and stats["fwd_bwd_s"] > 0
        assert_peak(stats["peak_bytes"])
        # one step of K/V forward, one backward, and dK/dV twice: 1 x 2 heads x 32 x 8 x 4 B x 2 (K and V) each
        assert stats["sent_bytes"] == {"per_step": 4096, "forward": 4096, "fwd_bwd": 3 * 4096}
    assert set(result["max_diff"]) == {"output", "dQ", "dK", "dV"}
    assert max(result["max_diff"].values()) < 1e-5
    assert result["kv_held_bytes"] == {"ring": 8192, "all_gather": 8192}


def test_torchrun_two_ranks_text_float64_contiguous():
    done = launch(TORCHRUN + DEMO + ["--seq-len", "37", "--heads", "2", "--head-dim", "8", "--dtype", "float64",
                                     "--no-load-balance", "--causal"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\x1b" not in done.stdout  # piped: plain text only
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ring attention on 2 ranks (gloo, cpu, 1 thread per rank): N = 37 positions, 18-19 per rank")
    assert "contiguous layout" in lines[0] and "float64, causal" in lines[1]
    header = lines.index(next(line for line in lines if line.split()[:2] == ["rank", "positions"]))
    assert [lines[header + 1].split()[:2], lines[header + 2].split()[:2]] == [["0", "19"], ["1", "18"]]
    diff_line = next(line for line in lines if line.startswith("max |diff|"))
    diffs = dict(part.split() for part in diff_line.split(": ", 1)[1].split(", "))
    assert set(diffs) == {"output", "dQ", "dK", "dV"}
    assert max(float(value) for value in diffs.values()) < 1e-10


def test_plain_python_is_a_world_of_one():
    done = launch([sys.executable] + DEMO + ["--seq-len", "50", "--heads", "2", "--head-dim", "4", "--dtype",
                                             "float64", "--causal", "--threads", "1", "--json"])
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert (result["world_size"], result["lengths"]) == (1, [50])
    assert result["ranks"][0]["sent_bytes"] == {"per_step": 0, "forward": 0, "fwd_bwd": 0}
    assert_peak(result["ranks"][0]["peak_bytes"])
    assert max(result["max_diff"].values()) < 1e-10


# Rank 0 late: torchrun stops every worker when one fails, so rank 1 failing first would kill
# rank 0 before it printed the only message (it did, once, in a loaded CI run).
SLOW_RANK_0 = ["-c", "import os, runpy, sys, time\n"
               "if os.environ['RANK'] == '0':\n    time.sleep(2)\n"
               "sys.argv[0] = 'selfattn.distributed.demo'\n"
               "runpy.run_module('selfattn.distributed.demo', run_name='__main__')"]


def test_torchrun_too_short_sequence_says_so_once_even_when_rank_0_is_late():
    done = launch(TORCHRUN + ["--no-python", sys.executable] + SLOW_RANK_0 + ["--seq-len", "1"])
    assert done.returncode != 0  # torchrun reports a failed child with its own exit status
    ours = [line for line in done.stderr.splitlines() if line.startswith("selfattn.distributed.demo: error:")]
    assert ours == ["selfattn.distributed.demo: error: --seq-len 1 is too short for 2 processes: "
                    "each needs at least one position"]
    assert "selfattn/distributed" not in done.stderr  # no traceback through our code (torchrun prints its own)


def test_bad_dtype_is_one_line_and_status_2():
    done = launch([sys.executable] + DEMO + ["--dtype", "int8"])
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "--dtype" in done.stderr and "int8" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def launched_by_torchrun(monkeypatch):
    """This process looks like rank ``rank`` of ``world`` to the demo; nothing starts before the checks."""

    def place(rank: int, world: int) -> None:
        for name, value in dict(RANK=rank, WORLD_SIZE=world, LOCAL_RANK=rank, LOCAL_WORLD_SIZE=world,
                                MASTER_ADDR="127.0.0.1", MASTER_PORT=1).items():
            monkeypatch.setenv(name, str(value))

    return place


@pytest.mark.parametrize("argv, message", [
    (["--seq-len", "0"], "--seq-len must be at least 1, got 0"),
    (["--heads", "0"], "--heads must be at least 1, got 0"),
    (["--head-dim", "-3"], "--head-dim must be at least 1, got -3"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--backend", "nccl"], "needs CUDA") if not torch.cuda.is_available() else (["--batch", "0"], "--batch must"),
])
def test_bad_options_are_one_line_and_status_2(argv, message, launched_by_torchrun, capsys):
    launched_by_torchrun(0, 1)
    assert demo.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith("selfattn.distributed.demo: error: ") and message in err
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("under_torchrun, status", [(False, 2), (True, 0)])
def test_usage_errors_come_from_rank_0_only(under_torchrun, status, launched_by_torchrun, monkeypatch, capsys):
    launched_by_torchrun(1, 2)
    if under_torchrun:  # torchrun waits for rank 0 (which says it and exits 2) only if the others succeed
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    else:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert demo.main(["--seq-len", "1"]) == status
    with pytest.raises(SystemExit) as exit_:
        demo.main(["--dtype", "int8"])
    assert exit_.value.code == status
    assert capsys.readouterr() == ("", "")


def test_rank_set_without_the_rest_of_torchrun(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    for name in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert demo.main([]) == 2
    assert "RANK is set but WORLD_SIZE, MASTER_ADDR, MASTER_PORT is not" in capsys.readouterr().err


@pytest.mark.skipif(not CLEAR_REFS_WORKS, reason="needs Linux /proc/self/clear_refs to reset the peak")
def test_peak_memory_sees_a_64_mb_tensor_and_not_its_absence():
    with PeakMemory("cpu") as peak:
        block = torch.ones(16 * 2**20)  # 64 MB, every page written
        del block
    assert peak.bytes >= 60 * 2**20
    assert peak.method.startswith("resident memory")
    with PeakMemory("cpu") as idle:
        pass
    assert 0 <= idle.bytes < 4 * 2**20


@pytest.mark.skipif(not CLEAR_REFS_WORKS, reason="needs Linux /proc/self/clear_refs to reset the peak")
def test_peak_memory_is_not_hidden_by_garbage_collected_inside_the_block():
    # A 128 MB tensor kept alive only by a reference cycle, as a kept traceback does: resident
    # until the cycle collector runs. If it ran inside the block, the block's 64 MB would be
    # paid for by the freed 128 MB and the peak would never rise above the start.
    cycle = {"tensor": torch.ones(32 * 2**20)}
    cycle["self"] = cycle
    del cycle
    with PeakMemory("cpu") as peak:
        gc.collect()  # what an automatic collection part way through the block does
        block = torch.ones(16 * 2**20)
        del block
    assert peak.bytes >= 60 * 2**20


def test_peak_memory_says_why_when_it_cannot_measure():
    with PeakMemory("meta") as peak:
        torch.ones(1024, device="meta")
    assert peak.bytes is None and peak.megabytes is None and peak.method is None
    assert "meta" in peak.unavailable


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_peak_memory_on_cuda_counts_the_block_only():
    held = torch.ones(2**20, device="cuda")  # 4 MB from before the block: not counted
    with PeakMemory("cuda") as peak:
        block = torch.ones(16 * 2**20, device="cuda")
        del block
    assert 64 * 2**20 <= peak.bytes < 70 * 2**20
    del held
