"""``selfattn plot --training`` and ``view --training``: a run's folder read back and drawn.

What ``selfattn train`` wrote, and nothing else: metrics.jsonl for the losses and every
head's scores, training.json for the settings, probe.json and probe/step-*.safetensors for
the probe's attention. The records go to ``viz.training_plot`` (the picture) and
``viz.training_view`` (the step-slider page).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from selfattn.errors import TrainingError
from selfattn.commands.plot_options import check_training_picture, run_folder
import selfattn.training.run_files as run_files
from selfattn.training.settings import TrainConfig
from selfattn.training.probe import read_snapshots
from selfattn.training.records import Probe, TrainingRun
from selfattn.render.visual import plots
from selfattn.render.visual.output_files import PAGE_EXTENSIONS, PICTURE_EXTENSIONS, write_text
from selfattn.render.visual.training_plot import training_figure
from selfattn.render.visual.training_view import render_training_page, training_page_data



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
    path = run_folder(folder)
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


def training_html(folder, layer: int | None = None, head: int | None = None) -> str:
    """The page for the run in ``folder``.

    Args:
        folder: the run's folder (``selfattn train --out``).
        layer: the layer shown first, from 0 (default: the best induction head's).
        head: the head shown first, from 0 (default: the best induction head's).

    Returns:
        The self-contained HTML page.

    Raises:
        TrainingError: the folder holds no run, or no stored probe attention.
        OptionError: ``layer`` or ``head`` is out of range.
    """
    run = read_run(folder)
    return render_training_page(training_page_data(run, read_probe(run), layer, head))


def view_training(folder, output, layer: int | None = None, head: int | None = None) -> Path:
    """Write the page for the run in ``folder`` to ``output`` (.html), atomically.

    Args:
        folder: the run's folder.
        output: the page's path, .html or .htm; checked before the run is read.
        layer: the layer shown first (default: the best induction head's).
        head: the head shown first (default: the best induction head's).

    Returns:
        The path written.

    Raises:
        OutputError: the output path cannot be written or has another extension.
        TrainingError: the folder holds no run, or no stored probe attention.
        OptionError: ``layer`` or ``head`` is out of range.
    """
    target = check_training_picture(folder, output, PAGE_EXTENSIONS)
    return write_text(target, training_html(folder, layer, head))


def plot_training(folder, output) -> Path:
    """Draw the run in ``folder`` and save it as PNG or SVG.

    Args:
        folder: the run's folder (``selfattn train --out``).
        output: the picture's path, .png or .svg; checked before the run is read.

    Returns:
        The path written.

    Raises:
        OutputError: the output path cannot be written or has another extension.
        TrainingError: the folder holds no run, or one that logged no step yet.
    """
    target = check_training_picture(folder, output, PICTURE_EXTENSIONS)
    return plots.save_figure(training_figure(read_run(folder)), target)
