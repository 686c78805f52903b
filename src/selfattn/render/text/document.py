"""A small document model shared by the text and markdown renderers.

The walkthrough is written once as a list of blocks; each renderer only decides how a
block looks (rich tables in a terminal, pipe tables in markdown).

Long inputs are summarised here, once for both renderers. A table with one row per token
shows every row up to ``SHOWN_ROWS`` tokens, and beyond that the first ``HEAD_ROWS``, the
query's row and the last ``TAIL_ROWS``; a token x token matrix shows every column up to
``SHOWN_COLUMNS`` keys, and beyond that its first and last columns, as many as fit
``TEXT_WIDTH`` characters. A line under a cut table says what it left out. The walkthrough
never cuts the query's own row (its scores, weights and context): those tables are tall,
one row per key, and always whole. ``--format json`` holds every number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence, Union

from selfattn.formatting import number_text


MAX_SHOWN_DIMS = 8  # wider vectors are shown as their first and last components
SHOWN_ROWS = 48  # a table with one row per token shows them all up to this many
HEAD_ROWS, TAIL_ROWS = 16, 8  # a taller one: its first rows, the query's row and its last rows
# A token x token matrix shows every key up to this many, as it always has (rich widens
# the table past the terminal); a wider one keeps the first and last keys that fit TEXT_WIDTH.
SHOWN_COLUMNS = 24
TEXT_WIDTH = 100  # characters: a 100-column terminal, the width piped text wraps its prose at


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 1


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Note:
    text: str
    warning: bool = False


@dataclass(frozen=True)
class Lines:
    """Monospaced lines: formulas, expansions, code."""

    lines: list[str]


@dataclass(frozen=True)
class Table:
    columns: list[str]
    rows: list[list[str]]
    title: str | None = None
    highlight_row: int | None = None  # the query's row, drawn in bold where possible
    numeric_from: int = 1  # columns from here on are right-aligned numbers


Block = Union[Heading, Paragraph, Note, Lines, Table]


@dataclass
class Document:
    blocks: list[Block] = field(default_factory=list)

    def add(self, *blocks: Block) -> None:
        self.blocks.extend(blocks)


def fmt(value: float, precision: int) -> str:
    """A number at fixed precision, or scientific when huge or tiny (``formatting.number_text``)."""
    return number_text(value, precision)


def fmt_vector(values: Iterable[float], precision: int) -> str:
    """[a, b, c], shortened to its first and last components when wide."""
    items = [fmt(v, precision) for v in values]
    if len(items) > MAX_SHOWN_DIMS:
        items = items[: MAX_SHOWN_DIMS - 2] + ["…"] + items[-1:]
    return "[" + ", ".join(items) + "]"


def shown_columns(width: int) -> list[int | None]:
    """Which of ``width`` components to show as table columns (None = an ellipsis column)."""
    if width <= MAX_SHOWN_DIMS:
        return list(range(width))
    return list(range(MAX_SHOWN_DIMS - 2)) + [None, width - 1]


def vector_cells(values: Sequence[float], precision: int) -> list[str]:
    return ["…" if i is None else fmt(values[i], precision) for i in shown_columns(len(values))]


def component_headers(width: int, name: str = "x") -> list[str]:
    return ["…" if i is None else f"{name}{i + 1}" for i in shown_columns(width)]


def display_token(token: str) -> str:
    """A token safe to print: control characters escaped so they cannot drive a terminal."""
    return token if token.isprintable() else token.encode("unicode_escape").decode("ascii")


def shown_rows(n: int, query: int) -> list[int | None]:
    """The rows of an n-token table to show (None = a row of '…'): every row up to SHOWN_ROWS,
    else the first HEAD_ROWS, the query's and the last TAIL_ROWS."""
    if n <= SHOWN_ROWS:
        return list(range(n))
    kept = sorted(set(range(HEAD_ROWS)) | {query} | set(range(n - TAIL_ROWS, n)))
    picks: list[int | None] = []
    for i in kept:
        if picks and i > picks[-1] + 1:  # type: ignore[operator]
            picks.append(None)
        picks.append(i)
    return picks


def token_span(indices: list[int]) -> str:
    """Positions as runs: [3, 4, 5, 9] -> "tokens 3-5, 9"."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return ("token " if len(indices) == 1 else "tokens ") + text


def left_out_line(rows: list[int] = (), columns: list[int] = (), what: str = "rows") -> Paragraph:
    """The line under a cut table: how many rows and columns it left out, and which tokens they are."""
    parts = []
    for indices, noun in ((rows, what), (columns, "columns")):
        if indices:
            name = noun[:-1] if len(indices) == 1 else noun
            parts.append(f"{len(indices)} {name} ({token_span(list(indices))})")
    return Paragraph("… left out: " + " and ".join(parts) + "; --format json has them all.")


def left_out(n: int, shown: Iterable[int | None]) -> list[int]:
    """The positions 0 .. n-1 that ``shown`` does not hold."""
    kept = {i for i in shown if i is not None}
    return [i for i in range(n) if i not in kept]


def token_table(
    columns: list[str],
    n: int,
    query: int,
    row: Callable[[int], list[str]],
    *,
    title: str | None = None,
    highlight: bool = True,
    numeric_from: int = 1,
) -> list[Block]:
    """A table with one row per token, ``row(i)`` its cells: every row, or cut (``shown_rows``) with a line saying so.

    Returns:
        [the Table], or [the cut Table, the line naming what it left out].
    """
    picks = shown_rows(n, query)
    rows = [["…"] * len(columns) if i is None else row(i) for i in picks]
    table = Table(columns, rows, title=title, highlight_row=picks.index(query) if highlight else None,
                  numeric_from=numeric_from)
    missing = left_out(n, picks)
    return [table, left_out_line(missing)] if missing else [table]


def token_lines(n: int, query: int, line: Callable[[int], str]) -> tuple[list[str], list[int]]:
    """One line per token, cut as ``shown_rows`` cuts a table ('…' for a gap), and the positions left out."""
    picks = shown_rows(n, query)
    return ["…" if i is None else line(i) for i in picks], left_out(n, picks)


# How a token x token matrix reads, for its title: the query asks, the key is looked at.
QUERY_KEY_AXES = "row = query (the token asking), column = key (the token looked at)"


def token_matrix(
    corner: str,
    labels: list[str],
    cell: Callable[[int, int], str],
    query: int,
    *,
    title: str | None = None,
    extra: Sequence[tuple[str, Callable[[int], str]]] = (),
) -> list[Block]:
    """An n x n matrix, row = query, column = key, ``cell(i, j)`` its text; the query's row highlighted.

    Every row and column up to SHOWN_ROWS and SHOWN_COLUMNS; beyond, the rows of
    ``shown_rows`` and the first and last columns that fit TEXT_WIDTH, with a line saying
    what was left out. ``extra`` columns (a header and ``f(i)``, e.g. the row sum) stay at the right.

    Returns:
        [the Table], or [the cut Table, the line naming what it left out].
    """
    n = len(labels)
    picks = shown_rows(n, query)
    rows_shown = [i for i in picks if i is not None]
    keys = _fitting_columns(corner, labels, cell, rows_shown, extra)
    header = [corner] + ["…" if j is None else labels[j] for j in keys] + [name for name, _ in extra]
    rows = [
        ["…"] * len(header) if i is None
        else [labels[i]] + ["…" if j is None else cell(i, j) for j in keys] + [f(i) for _, f in extra]
        for i in picks
    ]
    table = Table(header, rows, title=title, highlight_row=picks.index(query))
    missing_rows, missing_columns = left_out(n, picks), left_out(n, keys)
    if missing_rows or missing_columns:
        return [table, left_out_line(missing_rows, missing_columns)]
    return [table]


def _fitting_columns(corner, labels, cell, rows, extra) -> list[int | None]:
    """Every key up to SHOWN_COLUMNS; else the first and last keys (two from the front for each
    from the back) that keep the table within TEXT_WIDTH, with None for the '…' between them."""
    n = len(labels)
    if n <= SHOWN_COLUMNS:
        return list(range(n))

    def width(j: int) -> int:  # a column and its padding, as rich lays it out
        return max(len(labels[j]), *(len(cell(i, j)) for i in rows)) + 3

    used = 1 + max(len(corner), *(len(labels[i]) for i in rows)) + 3 + len("…") + 3
    used += sum(max(len(name), *(len(f(i)) for i in rows)) + 3 for name, f in extra)
    used += width(0) + width(n - 1)
    front, back = [0], [n - 1]
    while front[-1] + 1 < back[0]:
        side = back if len(front) >= 2 * len(back) else front  # two from the front for each from the back
        j = back[0] - 1 if side is back else front[-1] + 1
        if used + width(j) > TEXT_WIDTH:
            break
        used += width(j)
        if side is back:
            back.insert(0, j)
        else:
            front.append(j)
    if front[-1] + 1 == back[0]:  # everything fits after all
        return list(range(n))
    return front + [None] + back
