"""``selfattn explain``: one sentence's trace, written as text, markdown or JSON."""

from __future__ import annotations

from typing import TextIO

from selfattn.commands.explain_options import ExplainConfig
from selfattn.commands.traces import build_trace


def explain_command(config: ExplainConfig, stream: TextIO) -> None:
    """Build the trace ``config`` asks for and write it in ``config.format`` to ``stream``.

    Args:
        config: what to explain, and how ("text", "markdown" or "json").
        stream: where to write.
    """
    trace = build_trace(config)
    # Each format's renderers are imported when it is asked for: JSON needs neither the
    # walkthrough nor rich, and start-up is most of a short run's time.
    if config.format == "json":
        from selfattn.render.text.json_out import render_json

        stream.write(render_json(trace))
        return
    from selfattn.render.text.walk import walkthrough

    doc = walkthrough(trace, config.precision)
    if config.format == "markdown":
        from selfattn.render.text.markdown import render_markdown

        stream.write(render_markdown(doc))
    else:
        from selfattn.render.text.text import render_text

        render_text(doc, stream)
