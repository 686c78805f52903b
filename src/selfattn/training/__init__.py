"""Training small GPT-2 models from our modules, through our own attention.

``train(task, ...)`` runs one training run into a folder; ``read_metrics`` reads its
metrics back; ``training.probe`` reads its stored probe attention. The names load on
first use: the command line checks a run's settings and folders (``config``,
``run_files``) before torch is imported.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TASKS": "selfattn.training.config",
    "TrainConfig": "selfattn.training.config",
    "train": "selfattn.training.loop",
    "TrainingRun": "selfattn.training.records",
    "read_metrics": "selfattn.training.run_files",
}

__all__ = ["TASKS", "TrainConfig", "TrainingRun", "read_metrics", "train"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'selfattn.training' has no attribute {name!r}")
