"""Training small GPT-2 models from our modules, through our own attention.

``train(task, ...)`` runs one training run into a folder; ``read_metrics`` reads its
metrics back; ``training.probe`` reads its stored probe attention. The names load on
first use: the command line checks a run's settings and folders (``config``,
``run_files``) before torch is imported.
"""

from __future__ import annotations

from selfattn.lazy import lazy_names

_EXPORTS = {
    "TASKS": "selfattn.training.settings",
    "TrainConfig": "selfattn.training.settings",
    "train": "selfattn.training.loop",
    "TrainingRun": "selfattn.training.records",
    "read_metrics": "selfattn.training.run_files",
}

__all__ = ["TASKS", "TrainConfig", "TrainingRun", "read_metrics", "train"]


__getattr__, __dir__ = lazy_names(globals(), _EXPORTS)
