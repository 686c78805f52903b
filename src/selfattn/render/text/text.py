"""Render a walkthrough Document as terminal text with rich.

In a terminal: bold headings, coloured notes and box-drawn tables. Piped to a file or
another program: the same layout with no escape codes, and wide enough that tables
are never squeezed.
"""

from __future__ import annotations

import io
import sys
from typing import TextIO

from selfattn.render.text.document import Document, Heading, Lines, Note, Paragraph, Table

PIPED_WIDTH = 100  # prose wraps here when piped; tables take the width they need


def _table_width(table: Table) -> int:
    cells = [table.columns] + table.rows
    widths = [max(len(row[c]) for row in cells) for c in range(len(table.columns))]
    return sum(w + 3 for w in widths) + 1


def render_text(doc: Document, file: TextIO | None = None) -> None:
    """Print the document; escape codes only when ``file`` is a terminal."""
    from rich import box
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    file = file or sys.stdout
    is_terminal = file.isatty()
    width, target = None, file
    if not is_terminal:
        # Render into a buffer, then drop the spaces rich pads lines with.
        width, target = PIPED_WIDTH, io.StringIO()
    console = Console(
        file=target,
        width=width,
        force_terminal=is_terminal,
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=False,
    )

    blank = True  # whether the last line printed was blank: one blank line between parts

    def gap() -> None:
        nonlocal blank
        if not blank:
            console.print()
        blank = True

    for block in doc.blocks:
        if isinstance(block, (Heading, Table)):
            gap()
        blank = False
        if isinstance(block, Heading):
            style = "bold cyan" if block.level == 1 else "bold"
            console.print(Text(block.text, style=style))
            if not is_terminal:
                console.print("=" * len(block.text) if block.level == 1 else "-" * len(block.text))
        elif isinstance(block, Paragraph):
            console.print(Text(block.text))
        elif isinstance(block, Note):
            prefix = "Warning: " if block.warning else "Note: "
            console.print(Text(prefix + block.text, style="bold yellow" if block.warning else "italic"))
        elif isinstance(block, Lines):
            for line in block.lines:
                console.print(Text("  " + line), soft_wrap=True)
        elif isinstance(block, Table):
            if block.title:
                console.print(Text(block.title, style="bold"))
            table = RichTable(box=box.SIMPLE_HEAD, header_style="bold", show_edge=False)
            for c, name in enumerate(block.columns):
                justify = "right" if c >= block.numeric_from else "left"
                table.add_column(name, justify=justify, no_wrap=True)
            for r, row in enumerate(block.rows):
                table.add_row(*row, style="bold" if r == block.highlight_row else None)
            # Never squeeze numbers into ellipses: a table wider than the terminal wraps instead.
            screen_width = console.width
            console.width = max(screen_width, _table_width(block))
            console.print(table)
            console.width = screen_width
            gap()
    if not is_terminal:
        file.write("\n".join(line.rstrip() for line in target.getvalue().splitlines()) + "\n")
