"""Pictures of positional information: an encoding table, and RoPE's scores at many positions.

``positional_figure`` draws a (positions, dims) encoding; ``score_grids_figure`` draws
one fixed (q, k) pair scored at every pair of positions, for ``plot --kind
rope-distance``. Both take plain data and return a ``matplotlib.figure.Figure`` on a
diverging scale centred on 0; write it with ``plots.save_figure``.
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
from matplotlib.figure import Figure

from selfattn.errors import OptionError, ShapeError
from selfattn.viz.figure_parts import as_array, clamp_value, draw_matrix, axis_labels, new_figure, quiet_glyphs


@quiet_glyphs
def positional_figure(matrix, *, title=None, xlabel="dimension", ylabel="position", limit=None) -> Figure:
    """(positions, dims) encoding -> an image on a diverging scale centred on 0.

    The scale spans [-1, 1] (sinusoidal and RoPE cos/sin values), widened symmetrically
    when the matrix holds larger magnitudes. ``limit`` sets the span [-limit, limit]
    instead: learned embeddings are small, and would look blank on [-1, 1].

    Args:
        matrix: (positions, dims), the encoding (a tensor or nested lists).
        title: the figure's title, or None.
        xlabel: the columns' label (default "dimension").
        ylabel: the rows' label (default "position").
        limit: the scale's half-span, a positive number; None for max(1, largest magnitude).

    Returns:
        The figure: the image and its colour bar.

    Raises:
        ShapeError: the matrix is not 2-d and non-empty.
        OptionError: ``limit`` is not a positive finite number.
    """
    array = as_array(matrix, "matrix", "(positions, dims)", (2,))
    positions, dims = array.shape
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                              or not math.isfinite(limit) or limit <= 0):
        raise OptionError(f"limit must be a positive number, got {limit!r}")
    finite = np.abs(array[np.isfinite(array)])
    if limit is None:
        limit = max(1.0, float(finite.max()) if finite.size else 1.0)
    fig = new_figure(clamp_value(2.5 + 0.12 * dims, 5, 14), clamp_value(1.5 + 0.3 * positions, 3, 12))
    ax = fig.add_subplot()
    image = draw_matrix(ax, array, axis_labels(None, positions, ""), axis_labels(None, dims, ""),
                         cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto", title=title, xlabel=xlabel,
                         ylabel=ylabel)
    fig.colorbar(image, ax=ax, label="value")
    return fig


@quiet_glyphs
def score_grids_figure(grids, titles, *, title=None, xlabel="key position j", ylabel="query position i") -> Figure:
    """Several (n, n) score grids side by side, each on its own diverging scale centred on 0.

    Made for ``plot --kind rope-distance``: one fixed (q, k) pair at every pair of
    positions, so a grid that depends only on i - j shows stripes parallel to its main
    diagonal. Axes are positions 0 .. n-1, row 0 at the top; no cell values are printed.

    Args:
        grids: one or more (n, n) grids of one size (tensors or nested lists).
        titles: one title per grid, wrapped to the panel's width.
        title: the figure's title, or None.
        xlabel: the columns' label (default "key position j").
        ylabel: the rows' label (default "query position i").

    Returns:
        The figure: one panel and colour bar per grid.

    Raises:
        ShapeError: no grids, a title count that differs, or grids that are not square
            and of one size.
    """
    if isinstance(titles, str):
        raise ShapeError("titles must be a list of strings, one per grid; got one string")
    arrays = [as_array(grid, "each grid", "(n, n)", (2,)) for grid in grids]
    if not arrays or len(titles) != len(arrays):
        raise ShapeError(f"score_grids_figure needs one or more grids and one title each; got {len(arrays)} grids "
                         f"and {len(titles)} titles")
    n = arrays[0].shape[0]
    if any(a.shape != (n, n) for a in arrays):
        raise ShapeError(f"every grid must be square and of one size; got {[a.shape for a in arrays]}")
    panel = clamp_value(2.0 + 0.25 * n, 3.5, 7.0)
    fig = new_figure(min(1.0 + len(arrays) * (panel + 1.2), 28), panel + 1.6)
    axes = fig.subplots(1, len(arrays), squeeze=False)[0]
    labels = axis_labels(None, n, "")
    for ax, array, panel_title in zip(axes, arrays, titles):
        finite = np.abs(array[np.isfinite(array)])
        limit = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        image = draw_matrix(ax, array, labels, labels, cmap="RdBu_r", vmin=-limit, vmax=limit, xlabel=xlabel,
                             ylabel=ylabel)
        ax.set_title(textwrap.fill(str(panel_title), width=max(20, int(panel * 9))), parse_math=False)  # panel-wide
        fig.colorbar(image, ax=ax, shrink=0.8, label="score")
    if title:
        fig.suptitle(textwrap.fill(title, width=max(40, int(fig.get_figwidth() * 10))), parse_math=False)
    return fig
