"""What a training run leaves behind, as records: read by the loop, the commands and the pictures.

``TrainingRun`` (a run's settings, its metrics and how it ended), ``Probe`` (its probe's
attention at every stored step), the induction score at which a head counts as formed, and
``strongest`` (the head record with the highest score).
A leaf of the training package: the renderers read these without importing the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch

from selfattn.training.config import TrainConfig

INDUCTION_FORMED = 0.4
"""A head whose induction score on the probe reaches this has formed (the runs' summaries and pictures)."""


def strongest(heads: list[dict], score: str) -> dict:
    """The head record with the highest ``score`` ("induction", "previous_token", ...), the first of equals.

    Args:
        heads: metrics head records, each with a "layer", a "head" and its scores.
        score: the score's key.

    Returns:
        The record with the highest score.
    """
    return max(heads, key=lambda h: h[score])


@dataclass(frozen=True)
class TrainingRun:
    """What a run did.

    Attributes:
        folder: the run's folder (the checkpoint, metrics.jsonl, the probe's weights).
        config: its settings.
        step: the last step done (and saved).
        finished: False when it was interrupted before its last step.
        attention: which attention trained it, and why.
        metrics: the metrics records, one per logged step.
        wall_s: seconds this call trained.
        world_size: the processes that trained together.
        rank: this process's rank among them (0 writes the files).
    """

    folder: Path
    config: TrainConfig
    step: int
    finished: bool
    attention: str
    metrics: list[dict] = field(repr=False)
    wall_s: float
    world_size: int = 1
    rank: int = 0

    @property
    def final(self) -> dict | None:
        """The last metrics record, or None."""
        return self.metrics[-1] if self.metrics else None

    @property
    def induction_step(self) -> int | None:
        """The first logged step at which a head's induction score reached INDUCTION_FORMED."""
        for record in self.metrics:
            if max(h["induction"] for h in record["heads"]) >= INDUCTION_FORMED:
                return record["step"]
        return None


class Probe(NamedTuple):
    """The run's fixed probe and its attention at every stored step.

    Attributes:
        tokens: the probe's tokens, as probe.json spells them ("<s>" first when the
            vocabulary has it).
        repeat: R, the length of each copy.
        offset: 1 when ``<s>`` comes first, else 0.
        steps: the stored steps, in order.
        weights: one (layers, heads, n, n) float32 tensor per step, from ``read_snapshots``.
    """

    tokens: list[str]
    repeat: int
    offset: int
    steps: list[int]
    weights: list[torch.Tensor]
