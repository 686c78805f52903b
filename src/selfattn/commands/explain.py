"""``selfattn explain``: one sentence's trace, written as text, markdown or JSON."""

from __future__ import annotations

from typing import TextIO

from selfattn.commands.options import ExplainConfig
from selfattn.commands.traces import build_trace
from selfattn.explain.json_out import render_json
from selfattn.explain.markdown import render_markdown
from selfattn.explain.text import render_text
from selfattn.explain.walk import walkthrough


def explain_command(config: ExplainConfig, stream: TextIO) -> None:
    """Build the trace ``config`` asks for and write it in ``config.format`` to ``stream``.

    Args:
        config: what to explain, and how ("text", "markdown" or "json").
        stream: where to write.
    """
    trace = build_trace(config)
    if config.format == "json":
        stream.write(render_json(trace))
        return
    doc = walkthrough(trace.record, config.precision)
    if config.format == "markdown":
        stream.write(render_markdown(doc))
    else:
        render_text(doc, stream)
