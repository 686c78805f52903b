"""The pieces every attention figure is built from: input checks, a figure, a labelled matrix.

Inputs are plain data (torch tensors or nested lists, token strings), checked here with
one clear error each. A figure sits on the Agg canvas directly, never on
``matplotlib.pyplot``, which may pick a GUI backend and keeps global state. Token labels
are plain text: "$x$" or "a_b^c" show literally, never as mathtext.
"""

from __future__ import annotations

import functools
import math
import textwrap
import warnings

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from selfattn.errors import OptionError, ShapeError

COLOUR_BAR_LABEL_PAD = 10  # points between a colour bar's tick labels and its label (matplotlib's 4 crowds them)
CELL_VALUE_LIMIT = 20  # cell values print by default up to this many tokens per axis
MAX_TICK_LABELS = 60  # beyond this, only every k-th token is labelled


def quiet_glyphs(func):
    """Silence 'Glyph ... missing from font' warnings: the box drawn instead is enough."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Glyph .* missing from", category=UserWarning)
            return func(*args, **kwargs)

    return wrapper


def as_array(data, name: str, shape_doc: str, ndims: tuple[int, ...], dtype=float) -> np.ndarray:
    """Tensor or nested lists -> numpy array with one of ``ndims`` dimensions, none empty."""
    if hasattr(data, "detach"):  # a torch tensor; numpy cannot read bfloat16, so widen floats
        data = data.detach().cpu()
        data = (data.double() if data.is_floating_point() else data).numpy()
    try:
        array = np.asarray(data, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"{name} must be a rectangular array {shape_doc}: {exc}") from None
    if array.ndim not in ndims or 0 in array.shape:
        raise ShapeError(f"{name} must have shape {shape_doc}; got {tuple(array.shape)}")
    return array


def check_weight_matrix(weights: np.ndarray, name: str) -> None:
    # NaN is allowed (torch gives NaN for a fully masked row); the slack admits rounding error.
    finite = weights[np.isfinite(weights)]
    if finite.size and (finite.min() < -1e-3 or finite.max() > 1 + 1e-3):
        raise OptionError(f"{name} must lie in [0, 1]; got values from {finite.min():.4g} to {finite.max():.4g}")


def axis_labels(labels, count: int, name: str, prefix: str = "", start: int = 0) -> list[str]:
    """Labels as strings, one per row or column; None gives prefix + position, from ``start``."""
    if labels is None:
        return [f"{prefix}{i + start}" for i in range(count)]
    if isinstance(labels, str) or len(labels) != count:
        got = "one string" if isinstance(labels, str) else f"{len(labels)} labels"
        raise ShapeError(f"{name} must hold {count} labels, one per position; got {got}")
    return [str(label) for label in labels]


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def clamp_value(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def tick_font_size(count: int) -> float:
    """Points for the tick labels of an axis of ``count`` tokens."""
    return 9 if count <= CELL_VALUE_LIMIT else 7 if count <= MAX_TICK_LABELS else 5


def label_step(count: int, limit: int = MAX_TICK_LABELS) -> int:
    """k: every k-th of ``count`` positions is labelled, so that at most ``limit`` labels are drawn."""
    return max(1, math.ceil(count / max(1, limit)))


def thinned_note(count: int, step: int) -> str:
    """What an axis label adds when only every k-th token is labelled ("" when every one is)."""
    return "" if step == 1 else f" (one token in {step} labelled, of {count})"


def _set_ticks(axis, labels: list[str] | None, *, rotate: bool = False, limit: int = MAX_TICK_LABELS) -> int:
    """Label every position, or every k-th beyond ``limit``; None hides the ticks. -> k"""
    if labels is None:
        axis.set_ticks([])
        return 1
    step = label_step(len(labels), limit)
    positions = list(range(0, len(labels), step))
    axis.set_ticks(positions, labels=[labels[i] for i in positions], fontsize=tick_font_size(len(labels)),
                   rotation=90 if rotate else 0, parse_math=False)
    return step


def draw_matrix(ax, data, row_labels, col_labels, *, cmap, vmin, vmax, aspect="equal", title=None, xlabel=None,
                 ylabel=None, max_labels: int = MAX_TICK_LABELS, say_thinned: bool = False):
    """Draw a (rows, cols) matrix as an image, row 0 at the top, with its labels as plain text.

    At most ``max_labels`` labels per axis (every k-th past that); with ``say_thinned`` the
    axis's own label says so, e.g. "key (one token in 9 labelled, of 512)".
    """
    image = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect=aspect, interpolation="nearest")
    x_step = _set_ticks(ax.xaxis, col_labels, rotate=True, limit=max_labels)
    y_step = _set_ticks(ax.yaxis, row_labels, limit=max_labels)
    if say_thinned:
        xlabel = xlabel and xlabel + thinned_note(len(col_labels or ()), x_step)
        ylabel = ylabel and ylabel + thinned_note(len(row_labels or ()), y_step)
    if title:
        # About 9 characters of title per inch of figure; longer titles wrap instead of being cut.
        title = textwrap.fill(title, width=max(20, int(ax.figure.get_figwidth() * 9)))
    for setter, text in ((ax.set_title, title), (ax.set_xlabel, xlabel), (ax.set_ylabel, ylabel)):
        if text:
            setter(text, parse_math=False)
    return image


def colour_bar(fig: Figure, image, ax, label: str, **options):
    """A colour bar for ``image`` beside ``ax`` (an axes or an array of them), its label clear of the ticks.

    The label sits COLOUR_BAR_LABEL_PAD points from the tick labels, so it keeps its distance
    even where an SVG viewer draws the ticks in a wider font than matplotlib measured.
    """
    bar = fig.colorbar(image, ax=ax, **options)
    bar.set_label(label, labelpad=COLOUR_BAR_LABEL_PAD, parse_math=False)
    return bar
