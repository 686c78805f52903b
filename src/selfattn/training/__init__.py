"""Training small GPT-2 models from our modules, through our own attention.

``train(task, ...)`` runs one training run into a folder; ``read_metrics`` reads its
metrics back; ``training.probe`` reads its stored probe attention.
"""

from selfattn.training.config import TASKS, TrainConfig
from selfattn.training.loop import train
from selfattn.training.records import TrainingRun
from selfattn.training.run_files import read_metrics

__all__ = ["TASKS", "TrainConfig", "TrainingRun", "read_metrics", "train"]
