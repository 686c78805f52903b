"""What the model commands share: checking their input and writing text, markdown or JSON.

``selfattn heads``, ``selfattn similarity`` and ``selfattn compare`` check the format and
precision before any work, refuse an empty sentence the same way, and write through
the project's document model and renderers (JSON at full precision).
"""

from __future__ import annotations

import json
from typing import TextIO

from selfattn.errors import OptionError, SentenceError
from selfattn.render.text.document import Document, Heading, display_token, token_span
from selfattn.formatting import check_precision, compact_json, plain

FORMATS = ("text", "json", "markdown")
SHOWN_CHARS = 70  # a longer sentence is cut where it is named
SHOWN_TOKENS = 48  # a longer token list shows its first and last tokens, and says which it left out


def check_output(output_format: str, precision: int) -> None:
    """Refuse an unknown format or a precision out of range, before any work.

    Args:
        output_format: one of ``FORMATS``.
        precision: decimals for the numbers, 0 to 10.

    Raises:
        OptionError: an unknown format or precision.
    """
    if output_format not in FORMATS:
        raise OptionError(f"unknown format {output_format!r}: choose one of {', '.join(FORMATS)}")
    check_precision(precision)


def shown_tokens(tokens: list[str], separator: str) -> str:
    """The tokens joined by ``separator``, each made safe to print; past SHOWN_TOKENS the first
    SHOWN_TOKENS - 4, '…' and the last 3, followed by which tokens were left out."""
    n = len(tokens)
    if n <= SHOWN_TOKENS:
        return separator.join(display_token(t) for t in tokens)
    first, last = SHOWN_TOKENS - 4, n - 3
    shown = [display_token(t) for t in tokens[:first]] + ["…"] + [display_token(t) for t in tokens[last:]]
    return f"{separator.join(shown)} ({token_span(list(range(first, last)))} left out; --format json has them all)"


def check_sentence(sentence, name: str = "the sentence") -> None:
    """Refuse a sentence that is not a string or holds no word.

    Args:
        sentence: what the user gave as a sentence.
        name: how the error names it, e.g. "sentence B".

    Raises:
        SentenceError: not a string, or empty or only blanks.
    """
    if not isinstance(sentence, str):
        raise SentenceError(f"{name} must be a string, got {type(sentence).__name__}")
    if not sentence.strip():
        raise SentenceError(f"{name} is empty: give at least one word")


def shorten(sentence: str) -> str:
    """The sentence, cut to ``SHOWN_CHARS`` characters with "…" when longer.

    Args:
        sentence: the text to show.

    Returns:
        The text itself, or its start and "…", ``SHOWN_CHARS`` characters in all.
    """
    return sentence if len(sentence) <= SHOWN_CHARS else sentence[: SHOWN_CHARS - 1] + "…"


def write_json(data: dict, stream: TextIO) -> None:
    """Full-precision JSON: nested objects indented, each record of a list (one head) on one line.

    Args:
        data: the object to write; tensors become nested lists, non-finite floats strings.
        stream: where to write.
    """
    stream.write(_layout(plain(data), 0) + "\n")


def _layout(value, indent: int) -> str:
    pad = "  " * indent
    if isinstance(value, dict) and value:
        items = [f"{pad}  {json.dumps(k)}: {_layout(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        rows = [f"{pad}  {json.dumps(v, ensure_ascii=False, allow_nan=False)}" for v in value]
        return "[\n" + ",\n".join(rows) + "\n" + pad + "]"
    return compact_json(value, indent)  # numbers, strings, lists: one line per row of a matrix


def write_document(doc: Document, title: str, output_format: str, stream: TextIO) -> None:
    """Render ``doc`` under ``title`` as markdown, or as text for any other format.

    Args:
        doc: the blocks to render.
        title: the heading above them.
        output_format: "markdown", or "text".
        stream: where to write.
    """
    if output_format == "markdown":
        from selfattn.render.text.markdown import render_markdown

        stream.write(render_markdown(doc, title))
    else:
        from selfattn.render.text.text import render_text

        render_text(Document([Heading(title), *doc.blocks]), stream)


def command_lines(start: str, rest: str) -> list[str]:
    """A shell command on one line, or on two joined by a backslash when one would pass 96 characters.

    Args:
        start: the command's start (program, subcommand, sentence).
        rest: its options.

    Returns:
        One or two lines.
    """
    return [f"{start} {rest}"] if len(start) + len(rest) < 96 else [f"{start} \\", f"    {rest}"]


def label(index: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA, as spreadsheet columns.

    Args:
        index: a sentence's 0-based position.

    Returns:
        Its label.
    """
    text = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        text = chr(ord("A") + rest) + text
    return text
