"""The block map of a mask as a picture: one cell per (query block, key block).

A tiled kernel (``flash_attention``, ``flex_attention``) sees a mask only block by block:
EMPTY blocks are skipped, FULL blocks are computed without a mask, PARTIAL blocks are
computed with the mask applied per element. The picture colours each block by its state,
counts them in the legend, and says in the title how much of the grid is computed. It is
drawn from the block states alone (``block_states`` of a structured mask, the map of a
``BlockMask``), so a length of 65536 draws as fast as one of 64.
"""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from selfattn.errors import OptionError, ShapeError
from selfattn.masks.block_mask import BlockMask
from selfattn.masks.states import EMPTY, FULL, PARTIAL
from selfattn.masks.structured import StructuredMask
from selfattn.render.visual import plots
from selfattn.render.visual.figure_parts import as_array, clamp_value, new_figure, quiet_glyphs

# Full and partial take the colours of mask_figure's tile outlines; a skipped block is a grey cell here.
BLOCK_COLOURS = {EMPTY: "#e6e6e6", FULL: plots._BLOCK_STYLES[FULL][0], PARTIAL: plots._BLOCK_STYLES[PARTIAL][0]}
BLOCK_WORDS = {EMPTY: "empty: skipped", FULL: "full: computed without a mask", PARTIAL: "partial: mask applied per element"}
GRID_LINES_UP_TO = 64  # blocks per axis; beyond this the lines would hide the cells


def block_map_summary(states, block_size) -> str:
    """'32 x 32 blocks of 128: 9% computed, 3% partial': the grid, and the share computed and masked.

    Args:
        states: the block states, int (n_row_blocks, n_key_blocks) of EMPTY, FULL, PARTIAL.
        block_size: rows and keys per block, an int or a (rows, keys) pair.

    Returns:
        One line. Computed counts FULL and PARTIAL blocks; the shares are of the blocks.
    """
    grid = np.asarray(states)
    rows, keys = _pair(block_size)
    computed, partial = int((grid != EMPTY).sum()), int((grid == PARTIAL).sum())
    size = str(rows) if rows == keys else f"{rows} x {keys}"
    return (f"{grid.shape[0]} x {grid.shape[1]} blocks of {size}: {_percent(computed, grid.size)} computed, "
            f"{_percent(partial, grid.size)} partial")


@quiet_glyphs
def block_map_figure(states, block_size, q_len: int, kv_len: int, *, title: str | None = None) -> Figure:
    """(n_row_blocks, n_key_blocks) block states -> one coloured cell per block, a legend and the counts.

    The axes are token positions (query down, key across), so the last, shorter blocks of
    a length the block size does not divide are drawn to scale.

    Args:
        states: int (ceil(q_len / rows), ceil(kv_len / keys)) of EMPTY, FULL and PARTIAL
            (a tensor, array or nested lists).
        block_size: rows and keys per block, an int or a (rows, keys) pair.
        q_len: query positions the map covers.
        kv_len: key positions the map covers.
        title: a first title line (what the mask is); the second is ``block_map_summary``.

    Returns:
        The figure, on the Agg canvas (write it with ``plots.save_figure``).

    Raises:
        OptionError: a block size or length is not a positive integer.
        ShapeError: states is not 2-D, holds other values, or does not tile q_len x kv_len.
    """
    rows, keys = _pair(block_size)
    for name, size in (("q_len", q_len), ("kv_len", kv_len)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise OptionError(f"{name} must be a positive integer, got {size!r}")
    grid = as_array(states, "states", "(n_row_blocks, n_key_blocks)", (2,), dtype=None)
    if not np.isin(grid, list(BLOCK_COLOURS)).all():
        raise ShapeError(f"states must hold only EMPTY ({EMPTY}), FULL ({FULL}) and PARTIAL ({PARTIAL})")
    expected = (-(-q_len // rows), -(-kv_len // keys))
    if grid.shape != expected:
        raise ShapeError(f"states {grid.shape} do not tile {q_len} x {kv_len} in blocks of {rows} x {keys}: "
                         f"expected {expected}")
    height = clamp_value(6.0 * q_len / kv_len, 3.0, 9.0)
    fig = new_figure(7.0, height + 1.4)
    ax = fig.add_subplot()
    colours = ListedColormap([BLOCK_COLOURS[state] for state in sorted(BLOCK_COLOURS)])
    n_r, n_c = grid.shape
    ax.imshow(grid.astype(np.int8), cmap=colours, vmin=min(BLOCK_COLOURS), vmax=max(BLOCK_COLOURS),
              interpolation="nearest", extent=(0, n_c * keys, n_r * rows, 0), aspect="auto")
    ax.set_xlim(0, kv_len)  # the last blocks end at the lengths, not at a whole block
    ax.set_ylim(q_len, 0)
    if max(n_r, n_c) <= GRID_LINES_UP_TO:
        for x in range(keys, kv_len, keys):
            ax.axvline(x, color="white", linewidth=0.6)
        for y in range(rows, q_len, rows):
            ax.axhline(y, color="white", linewidth=0.6)
    ax.set_xlabel("key position", parse_math=False)
    ax.set_ylabel("query position", parse_math=False)
    summary = block_map_summary(grid, (rows, keys))
    wrapped = textwrap.fill(title or "", 70, break_long_words=False, break_on_hyphens=False)  # a file's path stays whole
    heading = f"{wrapped}\n{summary}" if title else summary
    ax.set_title(heading, parse_math=False)
    handles = [Patch(facecolor=BLOCK_COLOURS[state], edgecolor="#999999",
                     label=f"{BLOCK_WORDS[state]} ({int((grid == state).sum())})") for state in (EMPTY, FULL, PARTIAL)]
    legend = fig.legend(handles=handles, loc="outside lower center", ncols=2)
    for text in legend.get_texts():
        text.set_parse_math(False)
    return fig


def plot_block_mask(mask, path=None, *, block_size=None, q_len: int | None = None, title: str | None = None) -> Figure:
    """The block map of a ``BlockMask`` or any structured mask, as a figure (and a file when ``path`` is given).

    Args:
        mask: a ``BlockMask`` (``selfattn.create_block_mask``) or a structured mask of
            ``selfattn.masks`` (``CausalMask``, ``DocumentMask``, ``a | b``, ...).
        path: a .png or .svg file to write, checked before any work; None writes nothing.
        block_size: rows and keys per block, an int or a (rows, keys) pair; None: a
            BlockMask's own, or 128.
        q_len: query positions, needed only for a mask the same for every row
            (``PaddingMask``); None: the mask's own.
        title: the first title line; None: none.

    Returns:
        The figure of ``block_map_figure``.

    Raises:
        OptionError: a bad block size or q_len, or a mask that does not know its rows
            and no q_len.
        ShapeError: mask is not a structured mask.
        OutputError: path is not a .png or .svg in a folder we may write.

    Examples:
        >>> import selfattn as sa
        >>> from selfattn.render.visual.block_map_figure import plot_block_mask
        >>> causal = sa.create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 512, 512)
        >>> plot_block_mask(causal).axes[0].get_title()
        '4 x 4 blocks of 128: 62% computed, 25% partial'
    """
    target = plots.check_picture_path(path) if path is not None else None
    if not isinstance(mask, StructuredMask):
        raise ShapeError(f"plot_block_mask draws a BlockMask or a structured mask, got {type(mask).__name__}")
    if block_size is None:
        block_size = mask.block_size if isinstance(mask, BlockMask) else 128
    rows, keys = _pair(block_size)
    n_rows = mask.q_len if mask.q_len is not None else q_len
    if isinstance(n_rows, bool) or not isinstance(n_rows, int) or n_rows < 1:
        raise OptionError(f"q_len must be a positive integer for a mask the same for every row, got {n_rows!r}")
    figure = block_map_figure(mask.block_states(rows, keys, n_rows), (rows, keys), n_rows, mask.kv_len, title=title)
    if target is not None:
        plots.save_figure(figure, target)
    return figure


def _pair(block_size) -> tuple[int, int]:
    sizes = (block_size, block_size) if not isinstance(block_size, (tuple, list)) else tuple(block_size)
    if len(sizes) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise OptionError(f"the block size must be a positive integer or a (rows, keys) pair of them, got {block_size!r}")
    return sizes


def _percent(part: int, whole: int) -> str:
    """A share as a percentage that is 0% or 100% only when it is exactly so."""
    if part in (0, whole):
        return f"{100 * part // whole}%"
    share = 100 * part / whole
    return f"{share:.2g}%" if share < 1 else f"{min(max(round(share), 1), 99)}%"
