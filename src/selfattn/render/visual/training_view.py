"""``selfattn view --training DIR``: one offline page that replays the probe's attention as a run trained.

A step slider (← → keys, Home / End, or play) walks the stored steps; for each it shows the
chosen head's attention on the probe as a heatmap with the probe's tokens, every head as a
small picture (layers × heads; click one to choose it), every head's four scores at that
step, and over the steps the loss curves and both halves of the induction circuit (every
head's induction score, and every head's previous-token score), a marker at the step. The
page is built like the explorer (``viz.explorer``): plain JavaScript and SVG inlined with
the data, a Content-Security-Policy that forbids every fetch. It computes nothing: the weights are the
stored probe snapshots, the scores and losses the metrics records.

The embedded data (TRAINING_PAGE_DOC below) keeps each head's causal lower triangle as
whole numbers of thousandths, so a 1500-step run of 2 layers × 4 heads stays a few MB; a run
that stored more than MAX_PAGE_WEIGHTS weights is shown at evenly spaced steps (the first, the
last and the one its induction head formed at among them), and the page says so.
"""

from __future__ import annotations

import math

from selfattn.errors import OptionError
from selfattn.training.records import INDUCTION_FORMED, Probe, TrainingRun, strongest
from selfattn.render.visual.explorer import render_page
from selfattn.render.visual.training_run import (
    PREVIOUS_TOKEN_ROLE,
    formed_heads,
    formed_note,
    head_scores,
    previous_note,
    previous_token_heads,
    run_title,
)

WEIGHT_SCALE = 1000  # weights travel as round(w * 1000): three decimals
# At most this many weights on one page (about 10 MB): a longer run shows evenly spaced steps.
MAX_PAGE_WEIGHTS = 4_000_000
SCORE_FIELDS = ("induction", "previous_token", "first_token", "entropy")
DATA_ELEMENT_ID = "training-data"

TRAINING_PAGE_DOC = """The JSON in <script id="training-data">:

    title, description      the run, when its induction head formed and its previous-token heads, as text
    run                     {folder, task, steps, step (last logged), finished, n_layers, n_heads,
                            attention}
    tokens                  the probe's tokens (n of them); repeat R and offset (1 with <s> first)
    threshold               INDUCTION_FORMED (0.4)
    induction_step          the first logged step a head reached it, or null
    induction_heads         [[layer, head], ...]: the heads whose induction score reached it at some logged step
    role_threshold          PREVIOUS_TOKEN_ROLE (0.4, the score `selfattn heads` names a role at)
    previous_token_heads    [[layer, head], ...]: the heads whose previous-token score is at least
                            role_threshold at the last logged step
    scale                   1000: a weight w is stored as the whole number round(w * scale)
    score_fields            ["induction", "previous_token", "first_token", "entropy"]
    metrics                 one per logged step: {step, train_loss, val_loss, first_copy, second_copy (the probe's
                            losses), heads: [[the score_fields] for each head, layer by layer]}; a missing number is null
    frames                  one per stored probe step (evenly spaced ones past MAX_PAGE_WEIGHTS):
                            {step, weights: [one list per head, layer by layer, holding the lower
                            triangle row by row: entry i (i + 1) / 2 + j is query i's weight on key j <= i]}
    selected                {layer, head} shown first
"""



def _number(value, digits: int = 4):
    """A JSON number rounded to ``digits``, or None for a missing or non-finite one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return round(float(value), digits)


def _metrics_rows(run: TrainingRun, n_layers: int, n_heads: int) -> list[dict]:
    rows = []
    for record in run.metrics:
        scores = head_scores(record)
        probe = record.get("probe_loss") or {}
        rows.append({
            "step": record["step"],
            "train_loss": _number(record.get("train_loss")),
            "val_loss": _number(record.get("val_loss")),
            "first_copy": _number(probe.get("first_copy")),
            "second_copy": _number(probe.get("second_copy")),
            "heads": [[_number(scores.get((layer, head), {}).get(name)) for name in SCORE_FIELDS]
                      for layer in range(n_layers) for head in range(n_heads)],
        })
    return rows


def _frame(step: int, weights) -> dict:
    """One stored step: every head's lower triangle in thousandths.   weights: (layers, heads, n, n)"""
    import torch

    n = weights.shape[-1]
    rows, cols = torch.tril_indices(n, n)
    packed = (weights[..., rows, cols] * WEIGHT_SCALE).round().to(torch.int32)  # (layers, heads, n (n + 1) / 2)
    return {"step": step, "weights": packed.flatten(0, 1).tolist()}


def kept_steps(steps: list[int], per_step: int, formed: int | None, budget: int | None = None) -> list[int]:
    """The stored steps the page holds: all that fit ``budget`` weights, else evenly spaced ones.

    Args:
        steps: the stored steps, in order.
        per_step: the weights one step holds (layers x heads x the lower triangle).
        formed: the step the induction head formed at, kept if stored; or None.
        budget: the most weights the page holds (default MAX_PAGE_WEIGHTS).

    Returns:
        The steps to embed, in order; always the first and the last.
    """
    room = max(2, (MAX_PAGE_WEIGHTS if budget is None else budget) // max(1, per_step))
    if len(steps) <= room:
        return list(steps)
    picked = {steps[round(k * (len(steps) - 1) / (room - 1))] for k in range(room)}
    if formed in steps:
        picked.add(formed)
    return sorted(picked)


def _first_head(run: TrainingRun, layer: int | None, head: int | None) -> tuple[int, int]:
    """The head shown first: ``layer`` and ``head`` where given, the rest from the best induction head.

    The best is the highest induction score at the last logged step among the heads that
    fit what was given (only --layer 1: layer 1's best head).
    """
    fits = [h for h in run.metrics[-1]["heads"] if layer in (None, h["layer"]) and head in (None, h["head"])]
    best = strongest(fits or run.metrics[-1]["heads"], "induction")
    return (best["layer"] if layer is None else layer), (best["head"] if head is None else head)


def training_page_data(run: TrainingRun, probe: Probe, layer: int | None = None, head: int | None = None) -> dict:
    """The page's data (TRAINING_PAGE_DOC) for a run and its probe.

    Args:
        run: the run, from ``commands.training_pictures.read_run``.
        probe: its probe and stored attention, from ``commands.training_pictures.read_probe``.
        layer: the layer shown first, from 0 (default: the best induction head's, among
            the heads numbered ``head`` when that is given).
        head: the head shown first, from 0 (default: the best induction head's, in
            ``layer`` when that is given).

    Returns:
        A dict that ``explorer.data_json`` can embed; every weight is a stored snapshot's, rounded
        to 1 / WEIGHT_SCALE, every score and loss a metrics record's.

    Raises:
        OptionError: ``layer`` or ``head`` is out of range for the run's model.
    """
    n_layers, n_heads = probe.weights[0].shape[:2]
    chosen = _first_head(run, layer, head)
    for name, value, count in (("--layer", chosen[0], n_layers), ("--head", chosen[1], n_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
            noun = name.removeprefix("--") + ("s" if count > 1 else "")
            raise OptionError(f"{name} {value} is out of range: the run's model has {count} {noun} (0 to {count - 1})")
    c, n = run.config, len(probe.tokens)
    steps = kept_steps(probe.steps, n_layers * n_heads * n * (n + 1) // 2, run.induction_step)
    start = "<s>, " if probe.offset else ""
    description = (f"{formed_note(run)}; {previous_note(run)}. The probe is {start}{probe.repeat} random symbols, "
                   f"then the same {probe.repeat} again: an induction head makes each token of the repeat look at "
                   f"the token after its first copy, which it finds through a previous-token head of an earlier "
                   f"layer (each token looking at the one before). Weights are shown to 3 decimals.")
    if len(steps) < len(probe.steps):
        description += f" The page holds {len(steps)} of the {len(probe.steps)} stored steps, evenly spaced."
    kept = set(steps)
    frames = [_frame(step, weights) for step, weights in zip(probe.steps, probe.weights) if step in kept]
    return {
        "title": run_title(run),
        "description": description,
        "run": {"folder": str(run.folder), "task": c.task, "steps": c.steps, "step": run.step,
                "finished": run.finished, "n_layers": n_layers, "n_heads": n_heads, "attention": run.attention},
        "tokens": probe.tokens,
        "repeat": probe.repeat,
        "offset": probe.offset,
        "threshold": INDUCTION_FORMED,
        "induction_step": run.induction_step,
        "induction_heads": [list(h) for h in sorted(formed_heads(run))],
        "role_threshold": PREVIOUS_TOKEN_ROLE,
        "previous_token_heads": [list(h) for h in sorted(previous_token_heads(run))],
        "scale": WEIGHT_SCALE,
        "score_fields": list(SCORE_FIELDS),
        "metrics": _metrics_rows(run, n_layers, n_heads),
        "frames": frames,
        "selected": {"layer": chosen[0], "head": chosen[1]},
    }


def render_training_page(data: dict) -> str:
    """The page for ``training_page_data``'s dict: one HTML string, nothing to fetch.

    Args:
        data: the page's data (TRAINING_PAGE_DOC).

    Returns:
        The page, its CSS, script and data inlined.
    """
    return render_page("training.html", ("palette.css", "explorer.css", "training.css"), "training.js", data, "selfattn training run")
