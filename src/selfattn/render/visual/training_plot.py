"""``selfattn plot --training DIR --kind training``: a run's losses and heads on one step axis.

Top: the training and validation loss, and the probe's loss on its first copy (random
symbols) and on its repeat (which an induction head predicts).
Middle: every head's induction score, one line per head ("L1 H3", counted from 0), the
heads that reach INDUCTION_FORMED drawn thick, and a vertical line at the step the
induction head formed: the phase change, where the repeat's loss falls as the score jumps.
Bottom: every head's previous-token score, the other half of the circuit (a head that
looks at the token just before, which the induction head builds on), the heads that end
at PREVIOUS_TOKEN_ROLE or above drawn thick. A head keeps its colour in both panels.
The legends sit beside the axes, where they cover no curve. Every number comes from
metrics.jsonl.
"""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from selfattn.training.records import INDUCTION_FORMED, TrainingRun
from selfattn.render.visual.figure_parts import new_figure, quiet_glyphs
from selfattn.render.visual.training_run import (
    PREVIOUS_TOKEN_ROLE,
    formed_heads,
    formed_note,
    head_name,
    head_scores,
    previous_note,
    previous_token_heads,
    run_title,
)

LOSS_LINES = (  # (metrics field, label, colour, style)
    ("train_loss", "training loss", "#0969da", "-"),
    ("val_loss", "validation loss", "#d1242f", "-"),
)
PROBE_LINES = (
    ("first_copy", "probe: first copy (random)", "#6e7781", ":"),
    ("second_copy", "probe: repeated copy", "#1a7f37", "--"),
)
SCORE_PANELS = (  # (metrics field, y label, threshold, what a thick line means)
    ("induction", "induction score on the probe", INDUCTION_FORMED, f"thick: reaches {INDUCTION_FORMED}"),
    ("previous_token", "previous-token score on the probe", PREVIOUS_TOKEN_ROLE,
     f"thick: ≥ {PREVIOUS_TOKEN_ROLE} at the last step"),
)
FORMED_COLOUR = "#bc4c00"
MAX_LEGEND_HEADS = 16  # beyond this the legend names only the thick heads
BESIDE = dict(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)  # right of the axes


def _values(run: TrainingRun, read) -> tuple[list[int], list[float]]:
    """(steps, values) of the records where ``read(record)`` gives a number."""
    pairs = [(r["step"], read(r)) for r in run.metrics]
    pairs = [(s, float(v)) for s, v in pairs if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _head_colours(heads: list[tuple[int, int]], marked: set) -> dict[tuple[int, int], str]:
    """One colour per head while a palette has enough; beyond it, grey for the heads not in ``marked``."""
    palette = matplotlib.colormaps["tab10" if len(heads) <= 10 else "tab20"].colors
    if len(heads) <= len(palette):
        return {h: matplotlib.colors.to_hex(palette[i]) for i, h in enumerate(heads)}
    shown = sorted(marked)
    return {h: matplotlib.colors.to_hex(palette[shown.index(h) % len(palette)]) if h in marked else "#9aa0a6"
            for h in heads}


@quiet_glyphs
def training_figure(run: TrainingRun) -> Figure:
    """A run's losses (top), every head's induction score (middle) and previous-token score (bottom).

    Args:
        run: the run, from ``commands.training_pictures.read_run`` (or ``train``'s result).

    Returns:
        A figure with three axes sharing the step axis: losses, induction scores,
        previous-token scores. Each score axis holds one Line2D per head, labelled
        "L{layer} H{head}", its y data the head's score at every logged step; the heads
        that reach INDUCTION_FORMED (middle) or end at PREVIOUS_TOKEN_ROLE or above
        (bottom) are drawn thicker. Every legend sits outside its axes.
    """
    steps = [r["step"] for r in run.metrics]
    few = len(steps) <= 20  # markers show where the logged points are when there are few
    heads = sorted(head_scores(run.metrics[0]))
    fig = new_figure(12, 10.5)
    loss_ax, *score_axes = fig.subplots(3, 1, sharex=True, height_ratios=(2, 2.4, 2.4))
    for name, label, colour, style in LOSS_LINES:
        xs, ys = _values(run, lambda r, name=name: r.get(name))
        loss_ax.plot(xs, ys, style, color=colour, label=label, linewidth=1.8, marker="o" if few else None, markersize=3)
    for name, label, colour, style in PROBE_LINES:
        xs, ys = _values(run, lambda r, name=name: (r.get("probe_loss") or {}).get(name))
        if xs:
            loss_ax.plot(xs, ys, style, color=colour, label=label, linewidth=1.4)
    loss_ax.set_ylabel("loss (nats per token)")
    loss_ax.grid(alpha=0.3)
    loss_ax.legend(**BESIDE)

    thick_heads = {"induction": formed_heads(run), "previous_token": previous_token_heads(run)}
    colours = _head_colours(heads, thick_heads["induction"] | thick_heads["previous_token"])
    for ax, (score, ylabel, threshold, thick_means) in zip(score_axes, SCORE_PANELS):
        thick = thick_heads[score]
        for layer, head in heads:
            xs, ys = _values(run, lambda r, key=(layer, head): head_scores(r).get(key, {}).get(score))
            bold = (layer, head) in thick
            ax.plot(xs, ys, color=colours[(layer, head)], label=head_name(layer, head),
                    linewidth=2.6 if bold else 1.1, alpha=1.0 if bold else 0.75, zorder=3 if bold else 2,
                    marker="o" if few else None, markersize=3)
        ax.axhline(threshold, linestyle="--", color="#57606a", linewidth=1, label=f"threshold {threshold}")
        ax.set_ylim(0, 1)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        _heads_legend(ax, len(heads), thick, threshold, thick_means)
    score_axes[-1].set_xlabel("step")

    formed_at = run.induction_step
    if formed_at is not None:
        for ax in (loss_ax, *score_axes):
            ax.axvline(formed_at, color=FORMED_COLOUR, linestyle="-.", linewidth=1.2, zorder=1)
        score_axes[0].annotate(f"induction formed at step {formed_at}", (formed_at, 0.97), xytext=(4, 0),
                               textcoords="offset points", ha="left", va="top", color=FORMED_COLOUR, fontsize=9)
    loss_ax.set_title(f"{run_title(run)}\n{formed_note(run)}\n{previous_note(run)}", parse_math=False)
    for ax in (loss_ax, *score_axes):
        for text in ax.get_legend().get_texts():
            text.set_parse_math(False)
    return fig


def _heads_legend(ax, count: int, thick: set, threshold: float, title: str) -> None:
    """Every head's line in a legend beside ``ax``, or with many heads only the threshold and the thick ones."""
    handles = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    if count > MAX_LEGEND_HEADS:
        names = {head_name(*h) for h in thick} | {f"threshold {threshold}"}
        handles = [line for line in handles if line.get_label() in names]
    ax.legend(handles=handles, ncols=2 if len(handles) > 12 else 1, title=title if thick else None,
              title_fontsize=8, **BESIDE)
