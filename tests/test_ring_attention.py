"""ring_attention on real gloo process groups of 1 to 4 local processes.

Each launch starts P processes once (``distributed_harness``); every rank computes float64
``F.scaled_dot_product_attention`` on the full sequence and compares its own rows of the
output and of dQ, dK, dV with the ring's (``distributed_worker.py``). The tests below read
those reports, one parametrised test per case and world size, so a failure names both.
Failures of a rank (an exception, a mismatch, a silent peer) must end every rank with a
clear error, never a hang: the harness kills a launch that outlives its limit and fails.
"""

from __future__ import annotations

import re
import time

import pytest
import torch

from distributed_harness import launch
from distributed_worker import MISMATCHES, correctness_cases
from selfattn.distributed import ring_attention
from selfattn.errors import DistributedError

TOL = {"float64": dict(atol=1e-10, rtol=1e-10), "float32": dict(atol=1e-5, rtol=1e-5)}
WORLD_SIZES = (1, 2, 4)
PG_TIMEOUT = 10.0  # seconds; the failure launches use a short one so a hang shows quickly
SILENT_TIMEOUT = 5.0

RUNS = [(world, case) for world in WORLD_SIZES for case in correctness_cases(world) if case.expect_error is None]
REJECTIONS = [(world, case) for world in WORLD_SIZES for case in correctness_cases(world) if case.expect_error]


@pytest.fixture(scope="module")
def correctness():
    """The ``correctness`` launch for a world size, started on first use and shared by the module's tests."""
    done, failed = {}, {}

    def get(world: int):
        if world in failed:  # fail every test of a broken launch at once, without starting it again
            pytest.fail(failed[world], pytrace=False)
        if world not in done:
            try:
                run = launch("correctness", world, limit=150)
            except pytest.fail.Exception as error:
                failed[world] = str(error)
                raise
            if not all(r.returncode == 0 for r in run.ranks):
                failed[world] = f"the correctness launch on {world} ranks failed\n{run.describe()}"
                pytest.fail(failed[world], pytrace=False)
            done[world] = run
        return done[world]

    return get


@pytest.fixture(scope="module")
def mismatch_run():
    run = launch("mismatch", 3, limit=60, pg_timeout=PG_TIMEOUT)
    assert all(r.returncode == 0 for r in run.ranks), run.describe()
    return run


def within(error: float, magnitude: float, dtype: str) -> bool:
    """assert_close's bound, with the largest reference magnitude of the tensor."""
    return error <= TOL[dtype]["atol"] + TOL[dtype]["rtol"] * magnitude


def report(run, rank: int, name: str) -> dict:
    found = run.ranks[rank].cases()
    assert name in found, f"rank {rank} did not report case {name!r}\n{run.describe()}"
    return found[name]


def _params(cases):
    """One param per (world, case); the four-rank launch is the slow tier (four processes on the cores there are)."""
    return [pytest.param(w, c, id=f"P{w}-{c.name}", marks=[pytest.mark.slow] if w == 4 else []) for w, c in cases]


@pytest.mark.parametrize("world, case", _params(RUNS))
def test_ring_attention_matches_sdpa(correctness, world, case):
    run = correctness(world)
    wanted = {"out", *(f"d{name}" for name in case.grads)}
    for rank in range(world):
        rec = report(run, rank, case.name)
        assert rec["sharded_exactly"], f"rank {rank}: shard_sequence is not the rows tensor_split gives"
        assert rec["dtype"] == f"torch.{case.dtype}"
        assert rec["shape"] == rec["expected_shape"]
        assert rec["finite"], f"rank {rank}: NaN or inf in the output or a gradient"
        assert rec["other_grads_none"], f"rank {rank}: a gradient appeared on an input that did not ask for one"
        assert set(rec["errors"]) == wanted
        for name, error in rec["errors"].items():
            assert within(error, rec["magnitudes"][name], case.dtype), (
                f"rank {rank} of {world}, {name}: max abs error {error:.3g} vs float64 SDPA "
                f"(largest |reference| {rec['magnitudes'][name]:.3g}, tolerance {TOL[case.dtype]})"
            )
        if case.gather:
            for name, error in rec["gathered"].items():
                largest = max(report(run, r, case.name)["magnitudes"][name] for r in range(world))
                assert within(error, largest, case.dtype), f"rank {rank}: gather_sequence of {name} is off by {error:.3g}"


@pytest.mark.slow  # reads the four-rank launch
def test_every_rank_holds_the_split_it_should(correctness):
    """37 positions over 4 ranks: zigzag chunks 5,5,5,5,5,4,4,4 give 9,9,9,10; contiguous 10,9,9,9."""
    run = correctness(4)
    zigzag = [report(run, r, "float64-causal-zigzag-n37")["shape"][-2] for r in range(4)]
    contiguous = [report(run, r, "float64-causal-contiguous-n37")["shape"][-2] for r in range(4)]
    tiny = [report(run, r, "causal-zigzag-n5")["shape"][-2] for r in range(4)]  # chunks 1,1,1,1,1,0,0,0
    assert (zigzag, contiguous, tiny) == ([9, 9, 9, 10], [10, 9, 9, 9], [1, 1, 1, 2])


@pytest.mark.slow  # reads the four-rank launch
@pytest.mark.parametrize("case", ["causal-contiguous-n5", "float64-causal-contiguous-n37", "causal-zigzag-n5"])
def test_shards_wholly_in_the_future_give_no_nan(correctness, case):
    """Under a causal mask rank 0's queries see nothing of the later contiguous shards (and some
    zigzag chunks are empty): the merge must keep those rows finite, in the output and every gradient."""
    run = correctness(4)
    for rank in range(4):
        rec = report(run, rank, case)
        assert rec["finite"] and max(rec["errors"].values()) < 1e-10, rec


MESSAGES = {  # the start of every rank's message, by case name
    "reject-causal-lengths-off-zigzag": r"causal ring attention: the ranks hold \[\d+(, \d+)*\] positions, but a zigzag",
    "reject-causal-lengths-off-contiguous": r"causal ring attention: the ranks hold \[\d+(, \d+)*\] positions, but a contiguous",
    "reject-empty-shard": r"ring attention: (this rank's inputs|the inputs of rank 0): the shard is empty",
    "reject-n-below-p": r"a sequence of \d+ positions cannot give each of \d+ ranks at least one",
}


@pytest.mark.parametrize("world, case", _params(REJECTIONS))
def test_bad_lengths_are_rejected_on_every_rank(correctness, world, case):
    run = correctness(world)
    for rank in range(world):
        rec = report(run, rank, case.name)
        assert rec.get("error_type") == case.expect_error, rec
        assert re.match(MESSAGES[case.name], rec["message"]), rec["message"]
    if case.name.startswith("reject-causal"):
        lengths = ", ".join(str(n) for n in case.lengths)
        assert f"hold [{lengths}] positions" in rec["message"]
    if case.name == "reject-empty-shard":  # rank 0 holds nothing; the others name it
        assert report(run, 0, case.name)["message"].startswith("ring attention: this rank's inputs")
        assert all(report(run, r, case.name)["message"].startswith("ring attention: the inputs of rank 0")
                   for r in range(1, world))


@pytest.mark.slow  # reads the four-rank launch
def test_two_subgroups_run_their_own_rings(correctness):
    """On 4 ranks: a ring of global ranks {1, 2} (zigzag, 11 positions: 5 and 6) and one of {0, 3}
    (contiguous, 11 positions: 6 and 5) at the same time; rank 0 calling the {1, 2} ring is refused."""
    run = correctness(4)
    members = {"subgroup-1-2": (1, 2), "subgroup-0-3": (0, 3)}
    held = {1: 5, 2: 6, 0: 6, 3: 5}
    for name, ranks in members.items():
        for rank in range(4):
            found = run.ranks[rank].cases()
            assert (name in found) == (rank in ranks), f"rank {rank} and case {name}"
        for rank in ranks:
            rec = report(run, rank, name)
            assert rec["finite"] and rec["shape"][-2] == held[rank], rec
            assert all(within(e, rec["magnitudes"][k], "float64") for k, e in rec["errors"].items()), rec
    refused = report(run, 0, "non-member")
    assert refused["error_type"] == "DistributedError" and "not a member" in refused["message"]


EXPECTED_MISMATCH = {
    "heads": "the ranks disagree on batch and heads: rank 0 has (2, 3), rank 1 has (2, 4)",
    "head-dim": "the ranks disagree on query/key size d: rank 0 has 8, rank 1 has 4",
    "value-dim": "the ranks disagree on value size d_v: rank 0 has 8, rank 1 has 5",
    "dtype": "the ranks disagree on dtype: rank 0 has 'torch.float64', rank 1 has 'torch.float32'",
    "is-causal": "the ranks disagree on is_causal: rank 0 has False, rank 1 has True",
    "load-balance": "the ranks disagree on load_balance: rank 0 has True, rank 1 has False",
    "scale": "the ranks disagree on scale: rank 0 has None, rank 1 has 0.5",
    "gradients": "the ranks disagree on gradients: rank 0 has True, rank 1 has False",
}


@pytest.mark.parametrize("name", list(MISMATCHES))
def test_a_mismatch_on_one_rank_stops_every_rank(mismatch_run, name):
    """Rank 1 of 3 differs; all three raise DistributedError before sending anything."""
    for rank in range(3):
        rec = report(mismatch_run, rank, name)
        assert rec.get("error_type") == "DistributedError", rec
        if name == "integer-input":  # rank 1's own inputs are wrong: every rank names it
            whose = "this rank's inputs" if rank == 1 else "the inputs of rank 1"
            assert rec["message"] == f"ring attention: {whose}: query must be a floating-point tensor, got torch.int64"
        else:
            assert rec["message"] == f"ring attention: {EXPECTED_MISMATCH[name]} (rank {rank} reporting)"


def test_the_group_still_works_after_mismatches(mismatch_run):
    for rank in range(3):
        rec = report(mismatch_run, rank, "after-mismatches")
        assert rec["finite"] and all(within(e, rec["magnitudes"][k], "float64") for k, e in rec["errors"].items())


FAILURES = {  # scenario: (the rank that raises, what the other ranks were doing when they noticed)
    "die-before": (1, r"comparing the inputs of every rank failed"),
    "die-between": (0, r"(sending|receiving) (a key/value shard|key/value gradients)( from rank \d)? failed"),
}


@pytest.mark.parametrize("scenario", list(FAILURES))
def test_a_rank_that_raises_stops_every_rank(scenario):
    """3 ranks; one raises (before the call, or between forward and backward; rank 0 also hosts
    the store). The others must end with a DistributedError at once, not at the pg timeout."""
    fail_rank, doing = FAILURES[scenario]
    run = launch(scenario, 3, "--fail-rank", str(fail_rank), limit=60, pg_timeout=PG_TIMEOUT)
    errors = {r.rank: r.error() for r in run.ranks}
    assert all(r.returncode == 3 and errors[r.rank] for r in run.ranks), run.describe()
    failed = errors[fail_rank]
    assert failed["error_type"] == "RuntimeError" and failed["message"].startswith("planned failure")
    for rank, error in errors.items():
        if rank == fail_rank:
            continue
        assert error["error_type"] == "DistributedError", error
        assert re.match(rf"ring attention on rank {rank} of 3: {doing}: another rank probably stopped", error["message"]), error
        assert error["seconds"] < failed["seconds"] + PG_TIMEOUT / 2, f"rank {rank} only noticed after {error['seconds']:.1f} s"


@pytest.mark.slow  # waits out a process-group timeout on purpose
def test_a_silent_rank_times_out_every_other_rank():
    """Rank 1 of 3 stays alive but never calls: the others fail after the process group's timeout."""
    run = launch("silent", 3, "--fail-rank", "1", limit=60, pg_timeout=SILENT_TIMEOUT)
    assert run.ranks[1].returncode == 0 and run.ranks[1].of_kind("silent"), run.describe()
    for rank in (0, 2):
        assert run.ranks[rank].returncode == 3, run.describe()
        error = run.ranks[rank].error()
        assert error["error_type"] == "DistributedError"
        assert error["message"].startswith(f"ring attention on rank {rank} of 3: comparing the inputs of every rank failed")
        cause = error["message"].split("the process group timed out (", 1)[1]
        assert "timed out" in cause.lower(), error["message"]
        assert 0.9 * SILENT_TIMEOUT <= error["seconds"] <= SILENT_TIMEOUT + 5, error


def test_the_harness_kills_a_launch_that_hangs():
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"hung: ranks \[0\] were still running after 4 s and were killed"):
        launch("hang", 1, limit=4)
    assert time.monotonic() - started < 10


def test_ring_attention_needs_an_initialised_process_group():
    x = torch.zeros(1, 1, 4, 8)
    assert not torch.distributed.is_initialized()
    with pytest.raises(DistributedError, match="init_process_group"):
        ring_attention(x, x, x)
