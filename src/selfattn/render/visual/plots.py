"""Pictures of attention weights with matplotlib, for files on disk (PNG or SVG).

Every function takes plain data (torch tensors or nested lists, token strings) and
returns a ``matplotlib.figure.Figure``; none computes attention. Figures are built on
the Agg canvas directly: ``matplotlib.pyplot`` is never imported, because it may pick a
GUI backend and keeps global state. Write a figure with ``save_figure``, which also keeps
matplotlib's missing-glyph warnings (CJK tokens drawn as boxes) out of the user's output.

Token labels are plain text: "$x$" or "a_b^c" show literally, never as mathtext. The
positional pictures live in ``positional_plots`` and the pieces every figure shares in
``figure_parts``; both sets of figures are importable from here.

A mask's hidden cells (``hidden``: True where a query may not see a key, e.g. a decoder's
future tokens) are drawn grey, apart from the weight scale, with a legend line saying what
hid them; they carry no cell value and no arrow.

Any length draws: past MAX_TICK_LABELS tokens an axis labels every k-th token and says so
in its label, a grid of heads labels as many as its small panels hold, cell values are
left out (with a note) where they could not be read, and the arrows picture keeps the
query and the ARROW_KEYS keys it weighs most, saying how much weight the others hold.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from selfattn.errors import OptionError, ShapeError
from selfattn.masks.dense_states import states_of_dense
from selfattn.masks.states import EMPTY, FULL, PARTIAL
from selfattn.pipeline.tokenize import find_query
from selfattn.render.visual import output_files as output
from selfattn.render.visual.figure_parts import (
    CELL_VALUE_LIMIT,
    MAX_TICK_LABELS,
    as_array,
    check_weight_matrix,
    clamp_value,
    colour_bar,
    draw_matrix,
    axis_labels,
    label_step,
    new_figure,
    quiet_glyphs,
    thinned_note,
    tick_font_size,
)

SUPPORTED_EXTENSIONS = output.PICTURE_EXTENSIONS
PNG_DPI = 150
_WEIGHT_CMAP = "viridis"  # perceptually uniform, so equal weight steps look equal
_MASK_COLOURS = ("#d9d9d9", "#3b75af")  # hidden, allowed
_HIDDEN_COLOUR = _MASK_COLOURS[0]  # no colour of viridis: a hidden cell never reads as a small weight
ARROW_KEYS = 60  # the arrows picture draws every key up to this many; past it, the query and the heaviest keys
PANEL_LABEL_POINTS = 1.2  # a grid of heads leaves this many font sizes per tick label


def _hidden_cells(hidden, shape: tuple[int, ...]) -> np.ndarray | None:
    """``hidden`` as a bool array of ``shape`` (True = the mask hides this cell), or None."""
    if hidden is None:
        return None
    array = as_array(hidden, "hidden", str(shape), (len(shape),), dtype=None).astype(bool)
    if array.shape != shape:
        raise ShapeError(f"hidden must have the weights' shape {shape}; got {array.shape}")
    return array


def _weight_cmap(hidden: np.ndarray | None):
    cmap = matplotlib.colormaps[_WEIGHT_CMAP]
    return cmap if hidden is None else cmap.with_extremes(bad=_HIDDEN_COLOUR)


def _hidden_legend(fig: Figure, label: str) -> None:
    legend = fig.legend(handles=[Patch(facecolor=_HIDDEN_COLOUR, edgecolor="#999999", label=label)],
                        loc="outside lower center")
    for text in legend.get_texts():
        text.set_parse_math(False)


def _weight_scale(matrix: np.ndarray, hide: np.ndarray | None, fixed_scale: bool) -> tuple[float, float, str]:
    """(vmin, vmax, colour bar label) for a heatmap of ``matrix``.

    By default the colours span the smallest to the largest weight shown (hidden cells and
    NaN left out), so near-uniform weights such as 0.137-0.149 still differ in colour, and
    the label says which span it is. With ``fixed_scale``, or when every weight is the same,
    the colours span 0 to 1.
    """
    shown = matrix if hide is None else matrix[~hide]
    finite = shown[np.isfinite(shown)]
    if fixed_scale or finite.size == 0:
        return 0.0, 1.0, "attention weight (colours span 0-1)"
    low, high = float(finite.min()), float(finite.max())
    if high - low < 1e-12:
        return 0.0, 1.0, f"attention weight (all {low:.3f}; colours span 0-1)"
    decimals = max(3, 1 - math.floor(math.log10(high - low)))  # enough to tell low and high apart
    return low, high, f"attention weight\n(colours scaled to this map's {low:.{decimals}f}-{high:.{decimals}f})"


@quiet_glyphs
def heatmap_figure(
    weights, row_labels, col_labels=None, *, title=None, values=None, xlabel="key", ylabel="query",
    hidden=None, hidden_label="hidden by the causal mask", fixed_scale=False,
) -> Figure:
    """(q_len, kv_len) weights in [0, 1] -> a labelled heatmap with a colorbar.

    ``col_labels`` defaults to ``row_labels`` (self-attention). Each cell shows its
    value when ``values`` is True, or by default when both axes have at most
    CELL_VALUE_LIMIT tokens; past MAX_TICK_LABELS tokens the values could not be read,
    so they are left out and a note under the picture says so. Past MAX_TICK_LABELS an
    axis labels every k-th token, and its label says so. ``hidden`` (q_len, kv_len) bool
    marks the cells a mask hides: grey, no value, and ``hidden_label`` in a legend.
    The colours span this map's smallest to largest weight, as the colour bar's label
    says (``_weight_scale``); ``fixed_scale=True`` spans 0 to 1 instead, to compare maps.
    """
    matrix = as_array(weights, "weights", "(q_len, kv_len)", (2,))
    check_weight_matrix(matrix, "weights")
    hide = _hidden_cells(hidden, matrix.shape)
    q_len, kv_len = matrix.shape
    rows = axis_labels(row_labels, q_len, "row_labels")
    if col_labels is None:  # self-attention: the keys are the queries
        cols = axis_labels(row_labels, kv_len, "col_labels (row_labels when not given)")
    else:
        cols = axis_labels(col_labels, kv_len, "col_labels")
    unreadable = bool(values) and max(q_len, kv_len) > MAX_TICK_LABELS
    if values is None:
        values = max(q_len, kv_len) <= CELL_VALUE_LIMIT
    fig = new_figure(clamp_value(2.4 + 0.42 * kv_len, 4, 16), clamp_value(1.6 + 0.42 * q_len, 3, 16))
    ax = fig.add_subplot()
    shown = matrix if hide is None else np.ma.masked_array(matrix, mask=hide)
    vmin, vmax, scale_label = _weight_scale(matrix, hide, fixed_scale)
    image = draw_matrix(ax, shown, rows, cols, cmap=_weight_cmap(hide), vmin=vmin, vmax=vmax, title=title,
                         xlabel=xlabel, ylabel=ylabel, say_thinned=True)
    if unreadable:
        values = False
        fig.text(0.5, 0.0, f"Cell values left out: {q_len} x {kv_len} cells are too small to print them "
                 f"(at most {MAX_TICK_LABELS} tokens per axis).", ha="center", va="bottom", fontsize=8,
                 parse_math=False)
    colour_bar(fig, image, ax, scale_label, shrink=0.8)
    if values:
        for (i, j), weight in np.ndenumerate(matrix):
            if hide is None or not hide[i, j]:
                ax.text(j, i, f"{weight:.2f}", ha="center", va="center", fontsize=7, color=_contrast(image, weight))
    if hide is not None and hide.any():
        _hidden_legend(fig, hidden_label)
    return fig


def _contrast(image, value: float) -> str:
    """Black or white, whichever reads better on the colour the image gives ``value``."""
    red, green, blue, _ = image.cmap(image.norm(value))
    luminance = 0.2126 * red + 0.7152 * green + 0.0722 * blue  # Rec. 709 weights
    return "black" if luminance > 0.5 else "white"


@quiet_glyphs
def arrows_figure(tokens, weights_row, query, *, title=None, hidden=None,
                  hidden_label="hidden by the causal mask") -> Figure:
    """One query's (n,) weights -> the seed's picture: arrows from the query to every token.

    ``query`` is a token or a 0-based position (negative: from the end), resolved as the
    CLI does. An arrow's width (0.5 + 8 w/max w) and opacity (0.15 + 0.85 w/max w) grow
    with its weight, written after its head to three decimals; the query's own row is bold
    and boxed. ``hidden`` (n,) bool marks the keys a mask hides from the query: no arrow, a
    grey token, and ``hidden_label`` where the weight would be. Past ARROW_KEYS tokens the
    picture keeps the query and the keys it weighs most, in sentence order and named with
    their positions, and a line under it says how much weight the keys left out hold.
    """
    weights = as_array(weights_row, "weights_row", "(n,)", (1,))
    labels = axis_labels(tokens, weights.shape[0], "tokens")
    check_weight_matrix(weights, "weights_row")
    hide = _hidden_cells(hidden, weights.shape)
    index = find_query(labels, query)
    keys = _arrow_keys(weights, index, hide)
    n = len(keys)
    names = [labels[j] if len(keys) == len(labels) else f"{j}: {labels[j]}" for j in keys]
    top = np.nanmax(weights) if np.nanmax(weights, initial=0.0) > 0 else 1.0  # all zero: thin arrows
    fig = new_figure(6.5, clamp_value(0.42 * n + 1.2, 3, 40))
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_xlim(0, 1)
    ax.set_ylim(n - 0.5, -0.5)  # first token at the top, as in the sentence
    middle = (n - 1) / 2
    boxed = {"boxstyle": "round,pad=0.3", "facecolor": "#fff2b3", "edgecolor": "#c9a400"}
    ax.text(0.02, middle, labels[index], ha="left", va="center", fontsize=12, fontweight="bold", bbox=boxed,
            parse_math=False)
    for row, (j, token) in enumerate(zip(keys, names)):
        weight = weights[j]
        if hide is not None and hide[j]:
            ax.text(0.66, row, "hidden", ha="left", va="center", fontsize=9, color="#999999")
            ax.text(0.79, row, token, ha="left", va="center", fontsize=11, color="#999999", parse_math=False)
            continue
        strength = float(np.nan_to_num(weight)) / top
        width = 0.5 + 8 * strength
        ax.add_patch(FancyArrowPatch((0.22, middle), (0.64, row), arrowstyle="-|>", mutation_scale=8 + 1.5 * width,
                                     color="#3b75af", linewidth=width, alpha=0.15 + 0.85 * strength))
        ax.text(0.66, row, f"{weight:.3f}", ha="left", va="center", fontsize=9, color="#444444")
        ax.text(0.79, row, token, ha="left", va="center", fontsize=11, fontweight="bold" if j == index else "normal",
                bbox=boxed if j == index else None, parse_math=False)
    if title:
        ax.set_title(title, parse_math=False)
    if n < len(labels):
        left = [j for j in range(len(labels)) if j not in set(keys)]
        share = float(np.nansum(weights[left]))
        hidden_count = 0 if hide is None else int(hide[left].sum())
        masked = f", {hidden_count} of them hidden" if hidden_count else ""
        fig.text(0.5, 0.0, f"{len(labels)} keys: the query and the {n - 1} keys it weighs most are drawn; the other "
                 f"{len(left)}{masked} hold {share:.1%} of its weight.", ha="center", va="bottom", fontsize=8,
                 parse_math=False)
    if hide is not None and hide[keys].any():
        _hidden_legend(fig, f"grey, no arrow: {hidden_label}")
    return fig


def _arrow_keys(weights: np.ndarray, query: int, hide: np.ndarray | None) -> list[int]:
    """The keys the arrows picture draws: every one up to ARROW_KEYS, else the query and the heaviest, in order."""
    n = weights.shape[0]
    if n <= ARROW_KEYS:
        return list(range(n))
    visible = [j for j in range(n) if j != query and (hide is None or not hide[j])]
    heaviest = sorted(visible, key=lambda j: -float(np.nan_to_num(weights[j])))[: ARROW_KEYS - 1]
    return sorted(heaviest + [query])


@quiet_glyphs
def heads_figure(weights, tokens, *, layer_names=None, head_names=None, title=None, hidden=None,
                 hidden_label="hidden by the causal mask") -> Figure:
    """(layers, heads, n, n) or (heads, n, n) weights -> a grid of small heatmaps.

    One row per layer, one column per head ("head 0", ...; "layer 0", ... as in the
    explorer), every panel on one colour scale from 0 to 1 so that heads compare. Token labels sit on the outer axes only, as many as a panel holds (every
    k-th past that, and the title says so); cells carry no values.
    ``hidden`` (layers, n, n) bool, one mask per layer (or (n, n) for every layer), marks
    the cells a mask hides: grey, with ``hidden_label`` in a legend.
    """
    grid = as_array(weights, "weights", "(layers, heads, n, n) or (heads, n, n)", (3, 4))
    one_layer = grid.ndim == 3
    if one_layer:
        grid = grid[None]
    n_layers, n_heads, q_len, kv_len = grid.shape
    if q_len != kv_len:
        raise ShapeError(f"heads_figure shows self-attention: weights must be (..., n, n); got {grid.shape}")
    check_weight_matrix(grid, "weights")
    if hidden is not None and np.ndim(hidden) == 2:
        hidden = np.broadcast_to(np.asarray(hidden, dtype=bool), (n_layers, q_len, kv_len))
    hide = _hidden_cells(hidden, (n_layers, q_len, kv_len))
    labels = axis_labels(tokens, q_len, "tokens")
    heads = axis_labels(head_names, n_heads, "head_names", "head ", start=0)  # from 0, as --head, the JSON and the explorer
    layers = axis_labels(layer_names, n_layers, "layer_names", "layer ", start=0)
    show_layers = layer_names is not None or not one_layer
    panel = clamp_value(0.8 + 0.2 * q_len, 1.6, 3.0)
    width, height = min(1.8 + n_heads * panel, 32), min(1.2 + n_layers * panel, 32)
    fig = new_figure(width, height)
    side = min((width - 1.8) / n_heads, (height - 1.2) / n_layers)  # inches of one panel
    most = max(2, int(side * 72 / (tick_font_size(q_len) * PANEL_LABEL_POINTS)))
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    for (layer, head), ax in np.ndenumerate(axes):
        outer_x, outer_y = layer == n_layers - 1, head == 0
        panel_weights = grid[layer, head] if hide is None else np.ma.masked_array(grid[layer, head], mask=hide[layer])
        image = draw_matrix(ax, panel_weights, labels if outer_y else None, labels if outer_x else None,
                             cmap=_weight_cmap(hide), vmin=0.0, vmax=1.0, title=heads[head] if layer == 0 else None,
                             ylabel=layers[layer] if outer_y and show_layers else None, max_labels=most)
    colour_bar(fig, image, axes, "attention weight", shrink=0.6)
    if hide is not None and hide.any():
        _hidden_legend(fig, hidden_label)
    note = thinned_note(q_len, label_step(q_len, most)).strip()
    if title or note:
        fig.suptitle(" ".join(part for part in (title, note) if part), parse_math=False)
    return fig


@quiet_glyphs
def mask_figure(mask, row_labels=None, col_labels=None, *, title=None, allowed_label="may attend",
                hidden_label="masked", block_size: int | None = None) -> Figure:
    """(q_len, kv_len) bool mask, True = may attend -> a two-colour image with a legend.

    Labels default to positions 0, 1, ... The image holds 1 where the query may attend.
    block_size: also draw the block map a tiled kernel (flash attention) sees with square
    tiles of that size: skipped tiles hatched, full tiles (no mask) and partial tiles
    (masked) outlined in their own colours, with the counts in the title.
    """
    array = as_array(mask, "mask", "(q_len, kv_len)", (2,), dtype=None)
    if array.dtype != np.bool_:
        raise OptionError(f"mask must be boolean (True = may attend); got dtype {array.dtype}")
    q_len, kv_len = array.shape
    rows = axis_labels(row_labels, q_len, "row_labels")
    cols = axis_labels(col_labels, kv_len, "col_labels")
    fig = new_figure(clamp_value(2.8 + 0.32 * kv_len, 4, 16), clamp_value(1.6 + 0.32 * q_len, 3, 16))
    ax = fig.add_subplot()
    draw_matrix(ax, array.astype(np.int8), rows, cols, cmap=ListedColormap(_MASK_COLOURS), vmin=0, vmax=1,
                 title=title, xlabel="key", ylabel="query", say_thinned=True)
    handles = [Patch(facecolor=_MASK_COLOURS[1], label=allowed_label),
               Patch(facecolor=_MASK_COLOURS[0], label=hidden_label)]
    if block_size is not None:
        handles += _draw_block_map(ax, array, block_size)
        fig.set_figwidth(max(fig.get_figwidth(), 7.5))  # room for the five legend entries
    legend = fig.legend(handles=handles, loc="outside lower center", ncols=2)
    for text in legend.get_texts():
        text.set_parse_math(False)
    return fig


_BLOCK_STYLES = {  # state -> (edge colour, hatch, legend text)
    EMPTY: ("#555555", "////", "tile skipped (nothing visible)"),
    FULL: ("#2e8b57", None, "tile full (no mask needed)"),
    PARTIAL: ("#e07b00", None, "tile partial (masked)"),
}


def _draw_block_map(ax, array: np.ndarray, block_size: int) -> list:
    """Outline every block_size x block_size tile by its state; the title gets the counts. -> legend handles"""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise OptionError(f"the tile size must be a positive integer, got {block_size!r}")
    states = states_of_dense(torch.from_numpy(array), block_size, block_size).numpy()
    q_len, kv_len = array.shape
    for (i, j), state in np.ndenumerate(states):
        edge, hatch, _ = _BLOCK_STYLES[int(state)]
        height, width = min(block_size, q_len - i * block_size), min(block_size, kv_len - j * block_size)
        ax.add_patch(Rectangle((j * block_size - 0.5, i * block_size - 0.5), width, height, fill=False,
                               edgecolor=edge, hatch=hatch, linewidth=2.0 if hatch is None else 0.8))
    counts = {state: int((states == state).sum()) for state in _BLOCK_STYLES}
    summary = (f"{block_size}x{block_size} tiles: {counts[EMPTY]} skipped, {counts[FULL]} full, "
               f"{counts[PARTIAL]} partial of {states.size}")
    ax.set_title(f"{ax.get_title()}\n{summary}" if ax.get_title() else summary, parse_math=False)
    return [Patch(facecolor="none", edgecolor=edge, hatch=hatch, label=label) for edge, hatch, label in _BLOCK_STYLES.values()]


def check_picture_path(path) -> Path:
    """Validate a picture path before any work: .png or .svg, in a folder we may write."""
    return output.check_output_path(path, SUPPORTED_EXTENSIONS)


@quiet_glyphs
def save_figure(fig: Figure, path) -> Path:
    """Write ``fig`` as PNG (at PNG_DPI) or SVG, chosen by the extension; returns the path.

    Written atomically (``output.write_atomically``): a failure leaves no partial file
    and an existing target unchanged. SVG keeps text as <text> elements, so labels stay
    searchable and selectable.
    """
    target = check_picture_path(path)
    svg = target.suffix.lower() == ".svg"

    def render(temporary: Path) -> None:
        with matplotlib.rc_context({"svg.fonttype": "none"} if svg else {}):
            fig.savefig(temporary, format="svg" if svg else "png", dpi=PNG_DPI)

    return output.write_atomically(target, render)
