"""What the pictures of a training run say about it: head names, scores, the title, when heads formed.

The picture (``training_plot``) and the page (``training_view``) are handed the run as
``commands.training_pictures`` read it back from its folder. Nothing here reads a file,
recomputes attention or a score; when a head "formed" is ``TrainingRun.induction_step``,
the training package's own rule.
"""

from __future__ import annotations

from selfattn.training.records import INDUCTION_FORMED, TrainingRun


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
