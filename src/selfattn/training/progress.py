"""How a run shows where it is: a rich bar in a terminal, plain lines otherwise.

Both go to stderr, so a run's stdout (its summary) piped to a file stays clean. The bar
shows the step, the latest loss, tokens per second and the time left; piped, one line
per logged step says the same with the validation loss and the best induction score.
"""

from __future__ import annotations

import sys
import time

from selfattn.training.records import strongest


class TrainingProgress:
    """A context manager: ``update`` after every step, ``log`` for every metrics record.

    Args:
        total: the run's last step.
        start: the step it starts from (above 0 when resumed).
        enabled: False shows nothing (other ranks of a distributed run, or quiet calls).
        stream: where to write; stderr by default.
    """

    def __init__(self, total: int, start: int = 0, enabled: bool = True, stream=None) -> None:
        self.total, self.start, self.enabled = total, start, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.rich = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.began = time.perf_counter()
        self._bar = None

    def __enter__(self) -> "TrainingProgress":
        if self.rich:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                TimeRemainingColumn(), console=Console(file=self.stream), transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("train", total=self.total, completed=self.start, status="")
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        """Step ``step`` is done with training loss ``loss``."""
        if self._bar is not None:
            status = f"loss {loss:.3f}  {tokens_per_s:,.0f} tok/s"
            self._bar.update(self._task, completed=step, status=status)

    def log(self, record: dict) -> None:
        """A metrics record: printed as a line when piped, above the bar in a terminal."""
        if not self.enabled:
            return
        best = strongest(record["heads"], "induction")
        line = (
            f"step {record['step']:>{len(str(self.total))}}/{self.total}  train {record['train_loss']:.3f}  "
            f"val {record['val_loss']:.3f}  lr {record['lr']:.2e}  {record['tokens_per_s']:,.0f} tok/s  "
            f"induction {best['induction']:.2f} (L{best['layer']}H{best['head']})  {self._left(record['step'])}"
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

    def _left(self, step: int) -> str:
        done = step - self.start
        if done <= 0:
            return ""
        seconds = (time.perf_counter() - self.began) / done * (self.total - step)
        return f"{int(seconds) // 60}:{int(seconds) % 60:02d} left"
