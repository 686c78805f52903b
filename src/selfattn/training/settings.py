"""A training run's settings: one frozen dataclass, checked when it is made.

The two tasks start from different defaults (``TrainConfig.for_task``):

    induction   2 layers, 4 heads, width 128, context 64, batch 32, 1500 steps, lr 1e-3
    text        nanoGPT's CPU recipe: 4 layers, 4 heads, width 128, context 64, batch 12,
                2000 steps, lr 1e-3 decaying to 1e-4

Both use AdamW (betas 0.9 / 0.99, weight decay 0.1 on matrices and embeddings only), a
linear warm-up over the first steps and a cosine decay to min_lr, and gradients clipped
to norm 1.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from selfattn.errors import TrainingError, did_you_mean

TASKS = ("induction", "text")
MAX_STEPS = 1_000_000
DEFAULTS = {
    "induction": dict(n_layers=2, n_heads=4, d_model=128, context=64, batch_size=32, steps=1500, lr=1e-3,
                      min_lr=1e-4, warmup_steps=100, log_every=25, symbols=48, min_repeat=8),
    "text": dict(n_layers=4, n_heads=4, d_model=128, context=64, batch_size=12, steps=2000, lr=1e-3,
                 min_lr=1e-4, warmup_steps=100, log_every=50),
}


@dataclass(frozen=True)
class TrainConfig:
    """What a run trains and how.

    Attributes:
        task: "induction" or "text".
        corpus: for "text": "shakespeare" or a text file's path; None for "induction".
        steps: optimiser steps, 1 to 1,000,000.
        seed: seeds the initial weights and every batch.
        n_layers, n_heads, d_model: the model's sizes (GPT-2 family).
        context: tokens per training row (the model's positions).
        batch_size: rows per step, over all processes together.
        lr, min_lr: the peak learning rate and the end of the cosine decay.
        warmup_steps: steps of linear warm-up from 0 to lr.
        weight_decay: AdamW's decay on matrices and embeddings.
        grad_clip: the largest gradient norm; larger ones are scaled down to it.
        log_every: steps between metrics lines (validation loss, head scores, probe weights).
        checkpoint_every: steps between checkpoints (also saved at the end and on Ctrl-C).
        eval_batches: validation batches per metrics line.
        symbols: the induction task's alphabet size.
        min_repeat: the induction task's shortest repeated segment.
    """

    task: str
    corpus: str | None = None
    steps: int = 1500
    seed: int = 0
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 128
    context: int = 64
    batch_size: int = 32
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    log_every: int = 25
    checkpoint_every: int = 250
    eval_batches: int = 4
    symbols: int = 48
    min_repeat: int = 8

    @classmethod
    def for_task(cls, task, **settings) -> "TrainConfig":
        """The task's defaults, with ``settings`` (None means the default) on top.

        Raises:
            TrainingError: an unknown task or setting, or a value out of range.
        """
        if task not in TASKS:
            raise TrainingError(f"unknown task {task!r}: choose {' or '.join(TASKS)}{did_you_mean(task, TASKS)}")
        names = {f.name for f in dataclasses.fields(cls)} - {"task"}
        unknown = sorted(set(settings) - names)
        if unknown:
            raise TrainingError(f"unknown training setting {unknown[0]!r}; the settings are {', '.join(sorted(names))}")
        chosen = dict(DEFAULTS[task], **{k: v for k, v in settings.items() if v is not None})
        if task == "text":
            chosen.setdefault("corpus", "shakespeare")
        return cls(task=task, **chosen)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise TrainingError(f"unknown task {self.task!r}: choose {' or '.join(TASKS)}")
        if self.task == "induction" and self.corpus is not None:
            raise TrainingError("the induction task makes its own sequences: --corpus goes with --task text")
        if self.task == "text" and not isinstance(self.corpus, str):
            raise TrainingError("the text task needs a corpus: shakespeare or a text file")
        _whole(self.steps, "steps", 1, MAX_STEPS)
        _whole(self.seed, "seed", 0, 2**31 - 1)
        for name in ("n_layers", "n_heads", "d_model", "batch_size", "log_every", "checkpoint_every", "eval_batches"):
            _whole(getattr(self, name), name, 1, 1 << 16)
        _whole(self.context, "context", 8, 1 << 16)
        _whole(self.warmup_steps, "warmup_steps", 0, MAX_STEPS)
        if self.d_model % self.n_heads:
            raise TrainingError(f"d_model {self.d_model} must divide into n_heads {self.n_heads}")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise TrainingError(f"{name} must be a number >= 0, got {value!r}")
        if not 0 < self.lr or self.min_lr > self.lr:
            raise TrainingError(f"lr must be above 0 and min_lr at most lr, got lr {self.lr}, min_lr {self.min_lr}")
        if self.task == "induction":
            _whole(self.symbols, "symbols", 2, 62)
            _whole(self.min_repeat, "min_repeat", 2, (self.context - 1) // 2)

    def learning_rate(self, step: int) -> float:
        """lr at optimiser step ``step`` (0-based): linear warm-up, then cosine to min_lr at the last step."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / (self.warmup_steps + 1)
        span = max(1, self.steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (self.lr - self.min_lr)

    def to_json(self) -> dict:
        """The settings as JSON data."""
        return dataclasses.asdict(self)


def _whole(value, name: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TrainingError(f"{name} must be a whole number from {low:,} to {high:,}, got {value!r}")
