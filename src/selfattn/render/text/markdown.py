"""Render a walkthrough Document as GitHub-flavoured markdown."""

from __future__ import annotations

from selfattn.render.text.document import Document, Heading, Lines, Note, Paragraph, Table


def _cell(text: str) -> str:
    for char in "\\|*_`<>":
        text = text.replace(char, "\\" + char)
    return text or " "


def render_markdown(doc: Document, title: str = "Self-attention, step by step") -> str:
    out = [f"# {title}", ""]
    for block in doc.blocks:
        if isinstance(block, Heading):
            out += ["#" * (block.level + 1) + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            out += [block.text, ""]
        elif isinstance(block, Note):
            out += [f"> **{'Warning' if block.warning else 'Note'}:** {block.text}", ""]
        elif isinstance(block, Lines):
            out += ["```text", *block.lines, "```", ""]
        elif isinstance(block, Table):
            if block.title:
                out += [f"**{block.title}**", ""]
            align = [("---:" if c >= block.numeric_from else ":---") for c in range(len(block.columns))]
            out.append("| " + " | ".join(_cell(c) for c in block.columns) + " |")
            out.append("| " + " | ".join(align) + " |")
            for r, row in enumerate(block.rows):
                cells = [_cell(c) for c in row]
                if r == block.highlight_row:
                    cells = [f"**{c}**" if c.strip() else c for c in cells]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
    return "\n".join(out).rstrip() + "\n"
