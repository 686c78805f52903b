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

from selfattn.analysis.decoder_roles import (
    DECODER_THRESHOLD, FIRST_TOKEN, INDUCTION, MIXED, PREVIOUS_TOKEN, role_of,
)
from selfattn.training.settings import TrainConfig

INDUCTION_FORMED = DECODER_THRESHOLD
"""A head whose induction score on the probe reaches this has formed (the runs' summaries and pictures)."""
METRIC_KEYS = {PREVIOUS_TOKEN: "previous_token", INDUCTION: "induction", FIRST_TOKEN: "first_token"}
"""The patterns a metrics head record scores, and its key for each."""


def heads_by_role(heads: list[dict]) -> dict[str, list[dict]]:
    """The head records a run's probe names, by role: the one rule of ``decoder_roles.role_of``.

    A metrics record shows three numbers per head (previous_token, induction on the probe,
    first_token); the role is the highest when it reaches the threshold (0.4).

    Args:
        heads: metrics head records, each with layer, head, previous_token, induction and first_token.

    Returns:
        Role -> its head records, strongest first; "mixed" heads are left out.
    """
    named: dict[str, list[dict]] = {}
    for h in heads:
        role = role_of({name: h[key] for name, key in METRIC_KEYS.items()})
        if role != MIXED:
            named.setdefault(role, []).append(h)
    return {role: sorted(found, key=lambda h: -h[METRIC_KEYS[role]]) for role, found in named.items()}


def role_line(heads: list[dict]) -> str:
    """One line naming the heads by role, with the score that names them: "induction L1 H0 0.83, ...; previous token ..."."""
    named = heads_by_role(heads)
    parts = [f"{role} " + ", ".join(f"L{h['layer']} H{h['head']} {h[METRIC_KEYS[role]]:.2f}" for h in named[role])
             for role in (INDUCTION, PREVIOUS_TOKEN, FIRST_TOKEN) if role in named]
    return "; ".join(parts) if parts else "none (no score reaches 0.40)"


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
