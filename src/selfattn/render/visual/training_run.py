"""What the pictures of a training run say about it: head names, scores, the title, which heads formed.

The picture (``training_plot``) and the page (``training_view``) are handed the run as
``commands.training_pictures`` read it back from its folder. Nothing here reads a file,
recomputes attention or a score; when a head "formed" is ``TrainingRun.induction_step``,
the training package's own rule.

The two halves of the induction circuit are named by the same threshold, 0.4:
an induction head is one whose induction score reached INDUCTION_FORMED at some logged
step; a previous-token head is one whose previous-token score is at least
DECODER_THRESHOLD (the score ``selfattn heads`` needs to name a role) at the last logged step.
"""

from __future__ import annotations

from selfattn.analysis.decoder_roles import DECODER_THRESHOLD
from selfattn.training.records import INDUCTION_FORMED, TrainingRun

PREVIOUS_TOKEN_ROLE = DECODER_THRESHOLD
"""A head whose previous-token score is at least this at the last logged step is drawn as a previous-token head."""


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


def previous_token_heads(run: TrainingRun) -> set[tuple[int, int]]:
    """The (layer, head) pairs whose previous-token score is at least PREVIOUS_TOKEN_ROLE at the last logged step."""
    return {(h["layer"], h["head"]) for h in run.metrics[-1]["heads"] if h["previous_token"] >= PREVIOUS_TOKEN_ROLE}


def first_step_at(run: TrainingRun, head: tuple[int, int], score: str, threshold: float) -> int | None:
    """The first logged step at which ``head``'s ``score`` reached ``threshold``, or None."""
    for record in run.metrics:
        value = head_scores(record).get(head, {}).get(score)
        if isinstance(value, (int, float)) and value >= threshold:
            return record["step"]
    return None


def run_title(run: TrainingRun) -> str:
    """What the pictures say the run is: its folder, task (once, when the folder is named after it), steps and size."""
    c = run.config
    done = f"{c.steps} steps" if run.finished else f"step {run.step} of {c.steps}"
    name = run.folder.name if run.folder.name == c.task else f"{run.folder.name}: {c.task}"
    return f"Training run {name}, {done}, {c.n_layers} layers × {c.n_heads} heads"


def formed_note(run: TrainingRun) -> str:
    """One line on when the induction head formed, or that it did not."""
    formed = run.induction_step
    if formed is None:
        return f"no head reached induction {INDUCTION_FORMED} by step {run.step}"
    names = ", ".join(head_name(*h) for h in sorted(formed_heads(run)))
    return f"induction head formed at step {formed}; {names} pass {INDUCTION_FORMED}"


def previous_note(run: TrainingRun) -> str:
    """One line on which heads are previous-token heads at the last logged step, and since when."""
    heads = sorted(previous_token_heads(run))
    if not heads:
        best = max(run.metrics[-1]["heads"], key=lambda h: h["previous_token"])
        return (f"no previous-token head at step {run.step}: the highest previous-token score is "
                f"{head_name(best['layer'], best['head'])}'s, {best['previous_token']:.2f} (below {PREVIOUS_TOKEN_ROLE})")
    named = ", ".join(f"{head_name(*h)} (first at step {first_step_at(run, h, 'previous_token', PREVIOUS_TOKEN_ROLE)})"
                      for h in heads)
    return f"previous-token heads at step {run.step}, score ≥ {PREVIOUS_TOKEN_ROLE}: {named}"
