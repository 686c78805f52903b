"""``selfattn plot --training DIR --kind training``: a run's losses and heads on one step axis.

Top: the training and validation loss, and the probe's loss on its first copy (random
symbols nobody can predict) and on its repeat (which an induction head predicts).
Bottom: every head's induction score, one line per head ("L1 H3", counted from 0), the
heads that reach INDUCTION_FORMED drawn thick, the threshold dashed, and a vertical line
at the step the induction head formed: the phase change, where the repeat's loss falls
away from the first copy's as the score jumps. Every number comes from metrics.jsonl.
"""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from selfattn.training.records import INDUCTION_FORMED, TrainingRun
from selfattn.viz.figure_parts import new_figure, quiet_glyphs
from selfattn.viz.training_run import formed_heads, formed_note, head_name, head_scores, run_title

LOSS_LINES = (  # (metrics field, label, colour, style)
    ("train_loss", "training loss", "#0969da", "-"),
    ("val_loss", "validation loss", "#d1242f", "-"),
)
PROBE_LINES = (
    ("first_copy", "probe: first copy (random, unpredictable)", "#6e7781", ":"),
    ("second_copy", "probe: repeated copy", "#1a7f37", "--"),
)
FORMED_COLOUR = "#bc4c00"
MAX_LEGEND_HEADS = 16  # beyond this the legend names only the heads that formed


def _values(run: TrainingRun, read) -> tuple[list[int], list[float]]:
    """(steps, values) of the records where ``read(record)`` gives a number."""
    pairs = [(r["step"], read(r)) for r in run.metrics]
    pairs = [(s, float(v)) for s, v in pairs if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _head_colours(heads: list[tuple[int, int]], formed: set) -> dict[tuple[int, int], str]:
    """One colour per head while a palette has enough; beyond it, grey for the heads that did not form."""
    palette = matplotlib.colormaps["tab10" if len(heads) <= 10 else "tab20"].colors
    if len(heads) <= len(palette):
        return {h: matplotlib.colors.to_hex(palette[i]) for i, h in enumerate(heads)}
    shown = sorted(formed)
    return {h: matplotlib.colors.to_hex(palette[shown.index(h) % len(palette)]) if h in formed else "#9aa0a6"
            for h in heads}


@quiet_glyphs
def training_figure(run: TrainingRun) -> Figure:
    """A run's losses (top) and every head's induction score (bottom) over the steps.

    Args:
        run: the run, from ``commands.training_pictures.read_run`` (or ``train``'s result).

    Returns:
        A figure with two axes sharing the step axis. The bottom one holds one Line2D per
        head, labelled "L{layer} H{head}", its y data the head's induction score at every
        logged step; the heads that reach INDUCTION_FORMED are drawn thicker.
    """
    steps = [r["step"] for r in run.metrics]
    few = len(steps) <= 20  # markers show where the logged points are when there are few
    fig = new_figure(10, 8)
    loss_ax, heads_ax = fig.subplots(2, 1, sharex=True, height_ratios=(2, 3))
    for name, label, colour, style in LOSS_LINES:
        xs, ys = _values(run, lambda r, name=name: r.get(name))
        loss_ax.plot(xs, ys, style, color=colour, label=label, linewidth=1.8, marker="o" if few else None, markersize=3)
    for name, label, colour, style in PROBE_LINES:
        xs, ys = _values(run, lambda r, name=name: (r.get("probe_loss") or {}).get(name))
        if xs:
            loss_ax.plot(xs, ys, style, color=colour, label=label, linewidth=1.4)
    loss_ax.set_ylabel("loss (nats per token)")
    loss_ax.grid(alpha=0.3)

    heads = sorted(head_scores(run.metrics[0]))
    formed = formed_heads(run)
    colours = _head_colours(heads, formed)
    for layer, head in heads:
        xs, ys = _values(run, lambda r, key=(layer, head): head_scores(r).get(key, {}).get("induction"))
        thick = (layer, head) in formed
        heads_ax.plot(xs, ys, color=colours[(layer, head)], label=head_name(layer, head),
                      linewidth=2.6 if thick else 1.1, alpha=1.0 if thick else 0.75, zorder=3 if thick else 2,
                      marker="o" if few else None, markersize=3)
    heads_ax.axhline(INDUCTION_FORMED, linestyle="--", color="#57606a", linewidth=1,
                     label=f"threshold {INDUCTION_FORMED}")
    heads_ax.set_ylim(0, 1)
    heads_ax.set_ylabel("induction score on the probe")
    heads_ax.set_xlabel("step")
    heads_ax.grid(alpha=0.3)

    formed_at = run.induction_step
    if formed_at is not None:
        for ax in (loss_ax, heads_ax):
            ax.axvline(formed_at, color=FORMED_COLOUR, linestyle="-.", linewidth=1.2, zorder=1)
        heads_ax.annotate(f"formed at step {formed_at}", (formed_at, 0.97), xytext=(4, 0), textcoords="offset points",
                          ha="left", va="top", color=FORMED_COLOUR, fontsize=9)
    loss_ax.legend(loc="lower left", fontsize=8)
    _heads_legend(heads_ax, len(heads), formed)
    loss_ax.set_title(f"{run_title(run)}\n{formed_note(run)}", parse_math=False)
    for legend in fig.legends + [ax.get_legend() for ax in (loss_ax, heads_ax)]:
        for text in legend.get_texts():
            text.set_parse_math(False)
    return fig


def _heads_legend(ax, count: int, formed: set) -> None:
    """Every head's line in the legend, or with many heads only the threshold and those that formed."""
    handles = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    if count > MAX_LEGEND_HEADS:
        names = {head_name(*h) for h in formed} | {f"threshold {INDUCTION_FORMED}"}
        handles = [line for line in handles if line.get_label() in names]
    title = f"thick: reaches {INDUCTION_FORMED}" if formed else None
    # Above the near-zero lines of the heads that never formed, below the threshold: where no curve lingers.
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 0.06), fontsize=8, ncols=2 if len(handles) > 6 else 1, title=title,
              title_fontsize=8)
