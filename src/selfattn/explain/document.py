"""A small document model shared by the text and markdown renderers.

The walkthrough is written once as a list of blocks; each renderer only decides how a
block looks (rich tables in a terminal, pipe tables in markdown).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence, Union


MAX_SHOWN_DIMS = 8  # wider vectors are shown as their first and last components


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
    """A number at fixed precision; inf and NaN spelled out, and no '-0.0000'."""
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = f"{value:.{precision}f}"
    if text.startswith("-") and not text.strip("-0."):
        text = text[1:]
    return text


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
