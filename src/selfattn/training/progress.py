"""How a run shows where it is: a rich bar in a terminal, plain lines otherwise.

Both go to stderr, so a run's stdout (its summary) piped to a file stays clean; the plain
lines hold no colour codes and no carriage returns. The bar shows the step, the latest
loss, tokens per second, the time so far and the time left; piped, one line per logged
step says the same with the validation loss and the best induction score.

The time left is the mean pace of every step this session has done, times the steps to
go: ``elapsed / done * (total - step)``. It counts the validation, the probe and the
checkpoints as they come, so it holds on a busy machine as long as the load stays what it
was (rich's own estimate reads only the last 30 seconds, and jumps with every pause).
"""

from __future__ import annotations

import sys
import time

from selfattn.training.records import strongest


def time_left(elapsed_s: float, done: int, remaining: int) -> float | None:
    """Seconds to go at the mean pace so far, or None before the first step.

    Args:
        elapsed_s: seconds since the session's first step began.
        done: steps done in that time.
        remaining: steps still to do.

    Returns:
        ``elapsed_s / done * remaining``.
    """
    if done <= 0:
        return None
    return elapsed_s / done * max(0, remaining)


def clock(seconds: float | None) -> str:
    """Seconds as "m:ss", or "h:mm:ss" from an hour on; "?" when not known yet."""
    if seconds is None:
        return "?"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class TrainingProgress:
    """A context manager: ``update`` after every step, ``log`` for every metrics record.

    Args:
        total: the run's last step.
        start: the step it starts from (above 0 when resumed).
        enabled: False shows nothing (other ranks of a distributed run, or quiet calls).
        stream: where to write; stderr by default.
        timer: the clock, in seconds (``time.perf_counter``; tests pass their own).
    """

    def __init__(self, total: int, start: int = 0, enabled: bool = True, stream=None, timer=None) -> None:
        self.total, self.start, self.enabled = total, start, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.rich = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.timer = timer if timer is not None else time.perf_counter
        self.began = self.timer()
        self._bar = None

    def __enter__(self) -> "TrainingProgress":
        if self.rich:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(
                TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                TextColumn("{task.fields[timing]}"), console=Console(file=self.stream), transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("train", total=self.total, completed=self.start, status="",
                                            timing=self.timing(self.start))
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def timing(self, step: int) -> str:
        """The time so far and the time left once ``step`` is done: "0:35 so far, 0:17 left"."""
        elapsed = self.timer() - self.began
        return f"{clock(elapsed)} so far, {clock(time_left(elapsed, step - self.start, self.total - step))} left"

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        """Step ``step`` is done with training loss ``loss``."""
        if self._bar is not None:
            status = f"loss {loss:.3f}  {tokens_per_s:,.0f} tok/s"
            self._bar.update(self._task, completed=step, status=status, timing=self.timing(step))

    def log(self, record: dict) -> None:
        """A metrics record: printed as a line when piped, above the bar in a terminal."""
        if not self.enabled:
            return
        best = strongest(record["heads"], "induction")
        line = (
            f"step {record['step']:>{len(str(self.total))}}/{self.total}  train {record['train_loss']:.3f}  "
            f"val {record['val_loss']:.3f}  lr {record['lr']:.2e}  {record['tokens_per_s']:,.0f} tok/s  "
            f"induction {best['induction']:.2f} (L{best['layer']}H{best['head']})  {self.timing(record['step'])}"
        )
        if self._bar is not None:
            self._bar.console.print(line, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """A line of its own (the attention path, an interruption)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text, highlight=False)
        else:
            print(text, file=self.stream, flush=True)
