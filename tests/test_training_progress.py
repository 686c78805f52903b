"""How `selfattn train` shows its progress: the time left from the mean pace so far, clean lines when piped.

The reference is arithmetic done here: a fake clock says how many seconds have passed, so
the estimate must be (seconds so far) / (steps done) * (steps to go), to the second.
"""

from __future__ import annotations

import io

import pytest

from selfattn.training.progress import TrainingProgress, clock, time_left


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(step: int) -> dict:
    return {"step": step, "train_loss": 3.5, "val_loss": 3.25, "lr": 1e-3, "tokens_per_s": 51234.0,
            "heads": [{"layer": 1, "head": 2, "induction": 0.43}, {"layer": 0, "head": 0, "induction": 0.02}]}


@pytest.mark.parametrize("seconds, shown", [(None, "?"), (0, "0:00"), (59.4, "0:59"), (61, "1:01"), (699, "11:39"),
                                            (3600, "1:00:00"), (7322, "2:02:02")])
def test_clock(seconds, shown):
    assert clock(seconds) == shown


def test_time_left_is_the_mean_pace_times_the_steps_to_go():
    assert time_left(30.0, 100, 1400) == pytest.approx(420.0)
    assert time_left(30.0, 0, 1400) is None
    assert time_left(30.0, 100, 0) == 0.0


def test_piped_lines_hold_the_estimate_and_nothing_but_text():
    stream, now = io.StringIO(), FakeClock()
    with TrainingProgress(1500, stream=stream, timer=now) as bar:
        bar.note("training induction through reference attention; 1 process")
        now.now += 10.0  # 25 steps in 10 s: 0.4 s a step
        bar.update(25, 3.5, 51234.0)
        bar.log(record(25))
        now.now += 290.0  # a busy machine: the next 25 steps take 290 s, 300 s for 50 in all
        bar.log(record(50))
    lines = stream.getvalue().splitlines()
    assert lines == [
        "training induction through reference attention; 1 process",
        "step   25/1500  train 3.500  val 3.250  lr 1.00e-03  51,234 tok/s  induction 0.43 (L1H2)  0:10 so far, 9:50 left",
        "step   50/1500  train 3.500  val 3.250  lr 1.00e-03  51,234 tok/s  induction 0.43 (L1H2)  5:00 so far, 2:25:00 left",
    ]
    assert "\x1b" not in stream.getvalue() and "\r" not in stream.getvalue()


def test_a_resumed_run_counts_only_its_own_steps():
    stream, now = io.StringIO(), FakeClock()
    with TrainingProgress(1500, start=1000, stream=stream, timer=now) as bar:
        now.now += 50.0  # 100 steps of this session in 50 s
        bar.log(record(1100))
    assert stream.getvalue().endswith("0:50 so far, 3:20 left\n")


def test_the_bar_in_a_terminal_shows_the_same_estimate():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream, now = Terminal(), FakeClock()
    with TrainingProgress(400, stream=stream, timer=now) as bar:
        assert bar.rich
        now.now += 20.0
        bar.update(100, 3.25, 50000.0)
        task = bar._bar.tasks[0]
        assert (task.completed, task.fields["timing"]) == (100, "0:20 so far, 1:00 left")
        assert task.fields["status"] == "loss 3.250  50,000 tok/s"


def test_disabled_shows_nothing():
    stream = io.StringIO()
    with TrainingProgress(10, enabled=False, stream=stream) as bar:
        bar.update(5, 1.0, 1.0)
        bar.log(record(5))
        bar.note("hello")
    assert stream.getvalue() == ""
