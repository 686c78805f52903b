"""A training run's folder, read back for its pictures: the metrics, the settings, the probe.

The picture (``training_plot``) and the page (``training_view``) read what ``selfattn
train`` wrote and nothing else: metrics.jsonl for the losses and every head's scores,
training.json for the settings, probe.json and probe/step-*.safetensors for the probe's
attention. Nothing here recomputes attention or a score; when a head "formed" is
``TrainingRun.induction_step``, the training package's own rule.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

import torch

from selfattn.errors import TrainingError
from selfattn.models.files import DEFAULT_MODEL, MODELS, model_folder
from selfattn.training import run_files
from selfattn.training.config import TrainConfig
from selfattn.training.loop import TrainingRun
from selfattn.training.probe import INDUCTION_FORMED, read_snapshots

SHIPPED = tuple(name for name in MODELS if name != DEFAULT_MODEL)  # tiny-induction, tiny-shakespeare


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


def read_run(folder) -> TrainingRun:
    """The run in ``folder`` as ``train`` would have returned it, from its files.

    Args:
        folder: the run's folder (``selfattn train --out``), or the name of a model
            selfattn ships (tiny-induction, tiny-shakespeare); a run still training is
            read as far as it has logged.

    Returns:
        A ``TrainingRun`` with the settings of training.json and every metrics record;
        its ``step`` is the last logged step and ``wall_s`` the training seconds so far.

    Raises:
        TrainingError: the folder is missing, is a file, holds no run, or its run has
            logged no step yet.
    """
    path = Path(folder)
    if not path.exists() and str(folder) in SHIPPED:  # a model selfattn ships keeps its run's records
        path = model_folder(str(folder))
    if not path.exists():
        raise TrainingError(f"there is no training run at {folder}: the folder does not exist")
    if not path.is_dir():
        raise TrainingError(f"{folder} is a file, not a training run's folder")
    metrics = run_files.read_metrics(path)
    if not metrics:
        raise TrainingError(f"the run in {folder} has logged no step yet: nothing to draw")
    if not (path / run_files.SETTINGS).is_file():
        raise TrainingError(f"{folder} holds no training run ({run_files.SETTINGS} is missing)")
    settings = run_files.read_settings(path)
    try:
        config = TrainConfig(**settings["config"])
        records = [_finite(record) for record in metrics]
        if not all(isinstance(r["step"], int) and r["heads"] for r in records):
            raise ValueError("a record without its step or heads")
    except (KeyError, TypeError, ValueError) as error:
        raise TrainingError(f"cannot read the run in {folder}: {error}") from None
    last = records[-1]["step"]
    return TrainingRun(path, config, last, bool(settings.get("finished")) and last >= config.steps,
                       str(settings.get("attention", "")), records, float(records[-1].get("elapsed_s", 0.0)))


def _finite(record: dict) -> dict:
    """A metrics record with NaN and infinite losses (a diverged run) as None."""
    out = dict(record)
    for name in ("train_loss", "val_loss"):
        value = out.get(name)
        if isinstance(value, float) and not math.isfinite(value):
            out[name] = None
    return out


def read_probe(run: TrainingRun) -> Probe:
    """The run's probe and the attention stored at every logged step.

    Args:
        run: a run from ``read_run``.

    Returns:
        The probe's tokens, R, offset, and the (layers, heads, n, n) weights of each
        stored step, in step order.

    Raises:
        TrainingError: probe.json or the stored steps are missing or unreadable.
    """
    folder = run.folder
    try:
        probe = json.loads((folder / run_files.PROBE).read_text(encoding="utf-8"))
        tokens, repeat, offset = [str(t) for t in probe["tokens"]], int(probe["repeat"]), int(probe["offset"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise TrainingError(f"cannot read the probe of the run in {folder} ({run_files.PROBE}): {error}") from None
    from safetensors import SafetensorError

    try:
        snapshots = read_snapshots(folder)  # in step order
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as error:  # a cut or foreign file
        raise TrainingError(f"cannot read the probe's attention in {folder / 'probe'}: {error}") from None
    if not snapshots:
        raise TrainingError(f"the run in {folder} stored no probe attention (probe/ is empty or missing): "
                            "train one with selfattn train to replay it")
    shape = snapshots[0][1].shape
    if shape[-1] != len(tokens) or any(w.shape != shape for _, w in snapshots):
        raise TrainingError(f"the probe's attention in {folder / 'probe'} does not fit its {len(tokens)} tokens")
    return Probe(tokens, repeat, offset, [s for s, _ in snapshots], [w for _, w in snapshots])


def head_name(layer: int, head: int) -> str:
    """How a head is labelled in the pictures, from 0 as --layer and --head count: "L1 H3".

    Args:
        layer: the layer, from 0.
        head: the head in its layer, from 0.

    Returns:
        "L{layer} H{head}".
    """
    return f"L{layer} H{head}"


def head_scores(record: dict) -> dict[tuple[int, int], dict]:
    """A metrics record's head scores by (layer, head)."""
    return {(h["layer"], h["head"]): h for h in record["heads"]}


def formed_heads(run: TrainingRun) -> set[tuple[int, int]]:
    """The (layer, head) pairs whose induction score reached INDUCTION_FORMED at some logged step."""
    return {(h["layer"], h["head"]) for r in run.metrics for h in r["heads"] if h["induction"] >= INDUCTION_FORMED}


def run_title(run: TrainingRun) -> str:
    """What the pictures say the run is: its folder, task, steps and model size."""
    c = run.config
    done = f"{c.steps} steps" if run.finished else f"step {run.step} of {c.steps}"
    return f"Training run {run.folder.name}: {c.task}, {done}, {c.n_layers} layers × {c.n_heads} heads"


def formed_note(run: TrainingRun) -> str:
    """One line on when the induction head formed, or that it did not."""
    formed = run.induction_step
    if formed is None:
        return f"no head reached induction {INDUCTION_FORMED} by step {run.step}"
    names = ", ".join(head_name(*h) for h in sorted(formed_heads(run)))
    return f"induction head formed at step {formed}; {names} pass {INDUCTION_FORMED}"
