"""Pictures of positional information: an encoding table, RoPE's turns, and RoPE's scores at many positions.

``positional_figure`` draws a (positions, dims) encoding; ``rope_turns_figure`` draws
what RoPE does instead of adding a table: a few feature pairs turned by m theta_i at
positions m = 0, 1, ..., as arrows; ``score_grids_figure`` draws one fixed (q, k) pair
scored at every pair of positions, for ``plot --kind rope-distance``. All take plain data
and return a ``matplotlib.figure.Figure``; write it with ``plots.save_figure``.
"""

from __future__ import annotations

import math
import textwrap

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from selfattn.errors import OptionError, ShapeError
from selfattn.render.visual.figure_parts import as_array, clamp_value, colour_bar, draw_matrix, axis_labels, new_figure, quiet_glyphs


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
    colour_bar(fig, image, ax, "value")
    return fig


@quiet_glyphs
def rope_turns_figure(turned, pairs, thetas, *, title=None) -> Figure:
    """Feature pairs turned by RoPE at positions 0 .. n-1 -> one panel of arrows per pair.

    Row m of ``turned`` holds each shown pair as RoPE leaves it at position m; the arrow
    from the origin to it is drawn in a colour running from dark (m = 0) to light and
    numbered m at its tip, on the dashed unit circle. A pair that starts at (1, 0) ends at angle
    m theta_i, so fast pairs (large theta_i) sweep round the circle while slow ones barely move.

    Args:
        turned: (positions, pairs, 2), each pair's two features at each position.
        pairs: the index i of each shown pair (feature pair i of q or k).
        thetas: theta_i of each shown pair, its turn per position in radians.
        title: the figure's title, or None.

    Returns:
        The figure: one panel per pair, its arrows a ``quiver`` (U, V are the pair's features).

    Raises:
        ShapeError: ``turned`` is not (positions, pairs, 2), or ``pairs`` or ``thetas``
            do not name one pair each.
    """
    array = as_array(turned, "turned", "(positions, pairs, 2)", (3,))
    positions, count, two = array.shape
    if two != 2 or len(pairs) != count or len(thetas) != count:
        raise ShapeError(f"turned must be (positions, pairs, 2) with one pair index and one theta per pair; got "
                         f"{array.shape}, {len(pairs)} pair indices and {len(thetas)} thetas")
    fig = new_figure(min(0.8 + 3.6 * count, 16), 4.8)
    axes = fig.subplots(1, count, squeeze=False)[0]
    colours = matplotlib.colormaps["viridis"](np.linspace(0.0, 0.85, positions))  # position 0 dark
    circle = np.linspace(0.0, 2 * math.pi, 181)
    for ax, pair, theta, points in zip(axes, pairs, thetas, array.transpose(1, 0, 2)):
        ax.plot(np.cos(circle), np.sin(circle), linestyle="--", linewidth=0.8, color="#bbbbbb")
        ax.quiver(np.zeros(positions), np.zeros(positions), points[:, 0], points[:, 1], color=colours,
                  angles="xy", scale_units="xy", scale=1, width=0.012)
        for m, (x, y) in enumerate(points):
            length = math.hypot(x, y) or 1.0
            ax.text(1.2 * x / length, 1.2 * y / length, str(m), ha="center", va="center", fontsize=8, color=colours[m])
        ax.set_xlim(-1.4, 1.4)
        ax.set_ylim(-1.4, 1.4)
        ax.set_aspect("equal")
        ax.set_xlabel(f"feature {2 * pair}", parse_math=False)
        ax.set_ylabel(f"feature {2 * pair + 1}", parse_math=False)
        ax.set_title(f"pair {pair}: θ_{pair} = {theta:.3g} rad per position\n"
                     f"{(positions - 1) * theta:.2f} rad at position {positions - 1}", fontsize=10, parse_math=False)
    if title:
        fig.suptitle(textwrap.fill(title, width=max(40, int(fig.get_figwidth() * 11))), parse_math=False)
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
        colour_bar(fig, image, ax, "score", shrink=0.8)
    if title:
        fig.suptitle(textwrap.fill(title, width=max(40, int(fig.get_figwidth() * 10))), parse_math=False)
    return fig
