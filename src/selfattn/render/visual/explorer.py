"""The attention explorer: one self-contained HTML page that shows a trace's numbers.

The page is plain JavaScript and SVG, inlined together with its CSS and its data, so it
works offline and from a file; its Content-Security-Policy forbids every network fetch.
It computes nothing: every number it shows comes from ``explorer_data`` (see
``EXPLORER_DATA_DOC``), already rounded to the precision it prints.
"""

from __future__ import annotations

import html
import json
import re
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from selfattn.formatting import check_precision
from selfattn.trace.record import AttentionTrace
from selfattn.render.visual.explorer_data import explorer_data

if TYPE_CHECKING:
    from selfattn.models.model_output import ModelOutput

# Inline style and script only; no connect, font, frame or remote image sources.
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
DATA_ELEMENT_ID = "explorer-data"

NOTEBOOK_DEFAULT_HEIGHT = 600  # px, when the page's token count cannot be read
NOTEBOOK_MIN_HEIGHT, NOTEBOOK_MAX_HEIGHT = 400, 900  # px; taller pages scroll inside the frame

# JSON may hold "<", ">" and "&" only inside strings, where these escapes mean the same
# characters; escaped, no token can close the <script> element that carries the data.
# U+2028 / U+2029 are escaped for older JavaScript parsers that end lines at them.
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})
_PLACEHOLDER = re.compile(r"@@(CSP|TITLE|STYLE|DATA|SCRIPT)@@")
_DATA_ELEMENT = re.compile(
    r'<script type="application/json" id="' + DATA_ELEMENT_ID + r'">(.*?)</script>', re.DOTALL
)


@lru_cache(maxsize=None)
def _asset(name: str) -> str:
    return resources.files("selfattn.render.visual").joinpath("assets", name).read_text(encoding="utf-8")


def data_json(data: dict[str, Any]) -> str:
    """Compact JSON that is safe to place between <script> tags."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.translate(_SCRIPT_SAFE)


def render_explorer(data: dict[str, Any]) -> str:
    """The explorer page for ``explorer_data``'s dict: one HTML string, nothing to fetch."""
    return render_page("explorer.html", ("palette.css", "explorer.css"), "explorer.js", data, "selfattn explorer")


def render_page(template: str, styles: tuple[str, ...], script_name: str, data: dict[str, Any], default_title: str) -> str:
    """One self-contained page: the asset ``template`` with its CSS, script and data inlined.

    Args:
        template: the HTML asset, with @@CSP@@, @@TITLE@@, @@STYLE@@, @@DATA@@ and @@SCRIPT@@.
        styles: the CSS assets, in order.
        script_name: the script asset.
        data: the page's data, embedded as JSON.
        default_title: the title when data has none.

    Returns:
        The page as one HTML string.
    """
    style, script = "".join(_asset(name) for name in styles), _asset(script_name)
    # Our own assets must not end their elements early either.
    assert "</style" not in style.lower() and "</script" not in script.lower()
    parts = {
        "CSP": html.escape(CONTENT_SECURITY_POLICY, quote=True),
        "TITLE": html.escape(str(data.get("title") or default_title)),
        "STYLE": style,
        "DATA": data_json(data),
        "SCRIPT": script,
    }
    # One pass, so text put in for one placeholder is never read as another.
    return _PLACEHOLDER.sub(lambda match: parts[match.group(1)], _asset(template))


def explorer_html(
    trace: AttentionTrace,
    precision: int = 4,
    *,
    title: str | None = None,
    head: int | None = None,
    layer: int | None = None,
) -> str:
    """The explorer page for one record; ``layer`` and ``head`` are selected at first (0-based).

    ``trace`` is the record ``build_trace`` and the trace functions return (``record_of`` checks it).
    """
    return render_explorer(explorer_data(trace, precision, title=title, head=head, layer=layer))


def page_data(page: str) -> dict[str, Any] | None:
    """The data embedded in an explorer page, or None if the page has none."""
    found = _DATA_ELEMENT.search(page)
    if found is None:
        return None
    try:
        return json.loads(found.group(1))
    except ValueError:
        return None


def fitting_height(n_tokens: int) -> int:
    """Frame height in px: room for the line key, the head view and one step-table row per token."""
    return max(NOTEBOOK_MIN_HEIGHT, min(NOTEBOOK_MAX_HEIGHT, 480 + 26 * n_tokens))


def notebook_html(page: str, height: int | None = None) -> str:
    """An <iframe> holding ``page``, for a notebook's ``_repr_html_``.

    ``srcdoc`` keeps the page's ids, CSS and script apart from the notebook's and from
    other explorers in the same notebook; the sandbox lets the script run and nothing else.
    """
    if height is None:
        data = page_data(page)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        height = fitting_height(len(tokens)) if isinstance(tokens, list) else NOTEBOOK_DEFAULT_HEIGHT
    if isinstance(height, bool) or not isinstance(height, int) or height <= 0:
        raise ValueError(f"height must be a positive number of pixels, got {height!r}")
    return (
        f'<iframe srcdoc="{html.escape(page, quote=True)}" sandbox="allow-scripts" '
        f'width="100%" height="{height}" style="width: 100%; border: none;" '
        f'title="selfattn attention explorer"></iframe>'
    )


def notebook_explorer(
    trace: AttentionTrace,
    precision: int = 4,
    *,
    title: str | None = None,
    head: int | None = None,
    layer: int | None = None,
    height: int | None = None,
) -> str:
    """The explorer for one record inside an <iframe>: what a record's ``_repr_html_`` returns.

    As ``explorer_html``, an older view of the record is still accepted.
    """
    return notebook_html(explorer_html(trace, precision, title=title, head=head, layer=layer), height)


def notebook_model_explorer(
    output: ModelOutput, precision: int = 4, *, title: str | None = None, height: int | None = None
) -> str:
    """The explorer for the first text of a model's output, every layer and head: ``ModelOutput._repr_html_``.

    The output holds each head's weights but not the steps that made them, so the page
    shows weights (and hidden states, when the output has them) only.
    """
    from selfattn.render.visual.model_data import model_page_data, output_page

    check_precision(precision)
    if output.attentions is None:
        return (
            "<p>This model output holds no attention weights, so there is nothing to explore. "
            "Call the model with <code>output_attentions=True</code> (and "
            "<code>output_hidden_states=True</code> for the hidden states), e.g. "
            "<code>model(text, output_attentions=True)</code>.</p>"
        )
    data = model_page_data(output_page(output), precision, layer=0, head=0, title=title)
    return notebook_html(render_explorer(data), height)
