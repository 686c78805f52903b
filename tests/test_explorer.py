"""The HTML explorer in a real browser (Debian's Chromium through Playwright).

The page must show exactly the numbers `selfattn explain --format json` gives, formatted
at the page's precision, fetch nothing, and show any token as text.
"""

from __future__ import annotations

import html as html_lib
import json
import re
import time

import pytest
import torch

from browser import chromium, recorded_page
from selfattn.commands.explain_options import ExplainConfig
from selfattn.commands.traces import build_trace
from selfattn.render.text.json_out import render_json
from selfattn.render.visual.explorer import (
    CONTENT_SECURITY_POLICY,
    data_json,
    explorer_html,
    notebook_explorer,
    notebook_html,
    render_explorer,
)
from selfattn.formatting import rounded
from selfattn.render.visual.explorer_data import explorer_data

# A line's width and opacity, as documented in explorer.js: r = weight / the row's largest weight
# (overlaid heads: r = the weight itself, one scale 0..1 for every head),
# width = MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) r px, opacity = MIN_OPACITY + (1 - MIN_OPACITY) r.
MIN_WIDTH, MAX_WIDTH, MIN_OPACITY = 0.5, 8, 0.15
VIEWPORT = {"width": 1200, "height": 900}

LINES_JS = """els => els.map(e => ({
    query: Number(e.dataset.query), key: Number(e.dataset.key), head: Number(e.dataset.head),
    weight: Number(e.dataset.weight), width: Number(e.getAttribute("stroke-width")),
    opacity: Number(e.getAttribute("stroke-opacity")), stroke: e.getAttribute("stroke")}))"""


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser):
    with recorded_page(browser, viewport=VIEWPORT) as recorded:
        yield recorded


# ---- helpers ------------------------------------------------------------------------


def config(variant: str = "simple", **options) -> ExplainConfig:
    return ExplainConfig(variant=variant, format="json", **options)


def explain_json(cfg: ExplainConfig) -> dict:
    return json.loads(render_json(build_trace(cfg)))


def fmt(value, precision: int) -> str:
    """A JSON number as explain prints it at ``precision`` ("-inf" stays a word; scientific from 1e10 up, below 1e-10)."""
    if isinstance(value, str):
        return value
    if abs(value) >= 1e10 or 0 < abs(value) < 1e-10:
        return f"{value:.{precision}e}"
    text = f"{value:.{precision}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.0000"


def fmt_all(values, precision: int) -> list[str]:
    return [fmt(v, precision) for v in values]


def lines(page) -> list[dict]:
    return page.eval_on_selector_all("line.attention-line", LINES_JS)


def cells(page, column: str) -> list[str]:
    return page.eval_on_selector_all(f'#step-panel [data-col="{column}"]:not(.vector):not(th)', "els => els.map(e => e.textContent)")


def header_columns(page) -> list[str]:
    return page.eval_on_selector_all("#step-table thead th[data-col]", "els => els.map(e => e.dataset.col)")


def click_query(page, i: int) -> None:
    page.click(f'text.token.query[data-index="{i}"]')
    page.wait_for_selector(f'#head-view[data-query="{i}"]', state="attached")


def assert_lines_match(page, weights_row: list[float], precision: int, head: int = 0, query: int | None = None,
                       largest: float | None = None) -> None:
    """The head's lines: one per key with a nonzero weight, scaled to ``largest`` (default: the row's own largest;
    1.0 for overlaid heads, drawn on 0..1)."""
    drawn = [line for line in lines(page) if line["head"] == head]
    expected = {j: round(w, precision) for j, w in enumerate(weights_row) if round(w, precision) != 0}
    assert sorted(line["key"] for line in drawn) == sorted(expected), "one line per key with nonzero weight"
    largest = max(expected.values()) if largest is None else largest
    for line in drawn:
        if query is not None:
            assert line["query"] == query
        assert line["weight"] == pytest.approx(expected[line["key"]], abs=1e-12)
        relative = expected[line["key"]] / largest
        assert line["width"] == pytest.approx(MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * relative, abs=1e-6)
        assert line["opacity"] == pytest.approx(MIN_OPACITY + (1 - MIN_OPACITY) * relative, abs=1e-6)


def weights_at(data: dict, layer: int, head: int, query: int) -> list[float]:
    return data["layers"][layer]["heads"][head]["weights"][query]


# ---- numbers: the page shows what explain computes ---------------------------------------

VARIANTS = [
    pytest.param("simple", {}, 0, 4, id="simple"),
    pytest.param("causal", {}, 0, 4, id="causal"),
    pytest.param("gqa", {"heads": 4, "kv_heads": 2}, 2, 3, id="gqa-head3"),
]


@pytest.mark.parametrize("variant, options, head, precision", VARIANTS)
def test_page_shows_explain_numbers(page, variant, options, head, precision):
    trace = build_trace(config(variant, **options))
    page.load(explorer_html(trace, precision))
    default_query = explain_json(config(variant, **options))["query"]["index"]
    page.wait_for_selector(f'#head-view[data-query="{default_query}"]', state="attached")
    if head:
        page.select_option("#head", str(head))
    query = 3  # not the default, selected by a click
    click_query(page, query)
    assert page.get_attribute(f'text.token.query[data-index="{query}"]', "aria-pressed") == "true"
    assert page.get_attribute(f'text.token.query[data-index="{default_query}"]', "aria-pressed") == "false"

    ref = explain_json(config(variant, query=query, **options))
    q = ref["query"]
    multi = variant == "gqa"

    def of_head(value):
        return value[head] if multi else value

    assert_lines_match(page, of_head(q["weights"]), precision, head=head, query=query)

    if variant == "simple":
        expected = {"score": q["scores"], "exp": q["stable"]["exp"], "weight": q["weights"]}
        scalars = {"max": q["stable"]["max"], "exp_sum": q["stable"]["exp_sum"]}
        vectors = {"context": q["context"], "output": q["context"]}
    else:
        expected = {
            "score": of_head(q["scores_unscaled"]),
            "scaled": of_head(ref["scaling"]["scores_scaled"])[query],
            "exp": of_head(q["exp"]),
            "weight": of_head(q["weights"]),
        }
        if variant == "causal":  # the mask changes the softmax input: its own column
            expected["softmax_input"] = q["scores"]
        scalars = {"max": of_head(q["max"]), "exp_sum": of_head(q["exp_sum"])}
        vectors = {"context": of_head(q["head_context"]), "output": q["context"]}
        scale_header = page.text_content('#step-table thead th[data-col="scaled"]')
        assert scale_header == "× " + fmt(ref["scaling"]["scale"], precision)

    assert sorted(header_columns(page)) == sorted(expected)
    for column, values in expected.items():
        assert cells(page, column) == fmt_all(values, precision), column
    for column, value in scalars.items():
        assert cells(page, column) == [fmt(value, precision)], column
    for column, values in vectors.items():
        assert cells(page, column) == fmt_all(values, precision), column

    if variant == "causal":
        assert "-inf" in cells(page, "softmax_input")
        note = page.text_content("#mask-note")
        for j in range(query + 1, len(ref["tokens"])):
            assert f"{j}: {ref['tokens'][j]}" in note
    else:
        assert page.query_selector("#mask-note") is None
    page.assert_quiet()


def test_initial_state_and_keyboard(page):
    data = explorer_data(build_trace(config("multihead", heads=2)), head=1)
    page.load(render_explorer(data))
    view = page.locator("#head-view")
    assert view.get_attribute("data-query") == str(data["query"]) == "1"
    assert view.get_attribute("data-head") == "1"
    assert page.input_value("#head") == "1"
    assert view.get_attribute("data-max-width") == str(MAX_WIDTH)
    assert (view.get_attribute("data-min-width"), view.get_attribute("data-min-opacity")) == ("0.5", "0.15")
    assert page.is_hidden("#layer-control"), "a single layer needs no layer menu"
    assert_lines_match(page, weights_at(data, 0, 1, 1), 4, head=1, query=1)

    page.focus('text.token.query[data-index="1"]')
    page.keyboard.press("ArrowDown")
    assert view.get_attribute("data-query") == "2"
    assert page.evaluate("document.activeElement.dataset.index") == "2"
    assert page.get_attribute('text.token.query[data-index="2"]', "aria-pressed") == "true"
    assert page.get_attribute('text.token.query[data-index="1"]', "aria-pressed") == "false"
    assert_lines_match(page, weights_at(data, 0, 1, 2), 4, head=1, query=2)
    page.keyboard.press("ArrowUp")
    page.keyboard.press("ArrowUp")
    page.keyboard.press("ArrowUp")  # stops at the first token
    assert view.get_attribute("data-query") == "0"

    page.keyboard.press("Tab")  # the next token in the tab order: query 1
    assert page.evaluate("document.activeElement.getAttribute('aria-label')") == f"token 1: {data['tokens'][1]}"
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    assert view.get_attribute("data-query") == "2"
    page.focus('text.token.query[data-index="5"]')
    page.keyboard.press(" ")
    assert view.get_attribute("data-query") == "5"
    assert cells(page, "weight") == fmt_all(weights_at(data, 0, 1, 5), 4)

    page.hover('text.token.query[data-index="4"]')
    assert view.get_attribute("data-query") == "4", "hovering a query selects it"
    page.assert_quiet()


def test_switching_heads_and_layers(page):
    data = explorer_data(build_trace(config("multihead", heads=2)))
    n = len(data["tokens"])
    generator = torch.Generator().manual_seed(7)
    second = [torch.softmax(torch.randn(n, n, generator=generator) * 2, dim=-1) for _ in range(3)]
    data["layers"].append(
        {
            "name": "second layer",
            "heads": [{"name": f"L2 head {h}", "weights": rounded(w, 4), "steps": None} for h, w in enumerate(second)],
        }
    )
    page.load(render_explorer(data))
    query = data["query"]
    assert page.is_visible("#layer")
    layer_names = page.eval_on_selector_all("#layer option", "els => els.map(e => e.textContent)")
    assert layer_names == [data["layers"][0]["name"], "second layer"]

    head_0 = [line["weight"] for line in lines(page)]
    page.select_option("#head", "1")
    head_1 = [line["weight"] for line in lines(page)]
    assert head_0 != head_1
    assert_lines_match(page, weights_at(data, 0, 1, query), 4, head=1, query=query)
    assert cells(page, "weight") == fmt_all(weights_at(data, 0, 1, query), 4)

    page.select_option("#layer", "1")
    names = page.eval_on_selector_all("#head option", "els => els.map(e => e.textContent)")
    assert names == ["L2 head 0", "L2 head 1", "L2 head 2"]
    assert page.input_value("#head") == "1", "the head number is kept where the layer has it"
    assert_lines_match(page, weights_at(data, 1, 1, query), 4, head=1, query=query)
    assert page.is_visible("#steps-left-out")
    assert header_columns(page) == ["weight"]
    assert cells(page, "weight") == fmt_all(weights_at(data, 1, 1, query), 4)
    assert cells(page, "output") == fmt_all(data["output"][query], 4)

    page.select_option("#head", "2")
    click_query(page, 4)
    assert_lines_match(page, weights_at(data, 1, 2, 4), 4, head=2, query=4)
    page.select_option("#layer", "0")
    assert page.eval_on_selector_all("#head option", "els => els.length") == 2
    assert page.input_value("#head") == "1", "head 2 does not exist in the first layer"
    assert_lines_match(page, weights_at(data, 0, 1, 4), 4, head=1, query=4)
    page.assert_quiet()


LEGEND_SAMPLES_JS = ("els => els.map(e => [Number(e.dataset.relative), Number(e.getAttribute('stroke-width')),"
                     " Number(e.getAttribute('stroke-opacity'))])")


def test_line_width_tells_close_weights_apart(page):
    # A crafted row: 0.11 and 0.20 must not look alike although both are far from 1.
    data = explorer_data(build_trace(config()))
    n, query = len(data["tokens"]), data["query"]
    row = [0.11, 0.20, 0.30, 0.25, 0.10, 0.04] + [0.0] * (n - 6)
    assert n >= 6 and sum(row) == pytest.approx(1.0)
    head = data["layers"][0]["heads"][0]
    head["weights"] = [row if i == query else [1.0 if j == i else 0.0 for j in range(n)] for i in range(n)]
    head["steps"] = None  # the crafted weights have no steps behind them
    page.load(render_explorer(data))
    drawn = {line["key"]: line for line in lines(page)}
    assert sorted(drawn) == [0, 1, 2, 3, 4, 5]
    small, big, top = drawn[0], drawn[1], drawn[2]
    # Width above its floor and opacity above its floor are both in proportion to the weight.
    assert (big["width"] - MIN_WIDTH) / (small["width"] - MIN_WIDTH) == pytest.approx(0.20 / 0.11, rel=1e-6)
    assert (big["opacity"] - MIN_OPACITY) / (small["opacity"] - MIN_OPACITY) == pytest.approx(0.20 / 0.11, rel=1e-6)
    assert big["width"] >= 1.5 * small["width"], "0.20 must be clearly wider than 0.11"
    assert (top["width"], top["opacity"]) == (pytest.approx(MAX_WIDTH), pytest.approx(1.0))  # the row's largest
    assert drawn[5]["width"] == pytest.approx(MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * 0.04 / 0.30)

    caption = page.text_content("#line-legend figcaption")
    assert caption == "Line width and darkness: weight relative to this row's largest (largest = full)."
    assert page.text_content("#line-largest") == "Largest weight in this row: 0.3000 (drawn at full width)."
    samples = page.eval_on_selector_all(
        "#line-samples .legend-line",
        "els => els.map(e => [Number(e.dataset.relative), Number(e.getAttribute('stroke-width')),"
        " Number(e.getAttribute('stroke-opacity'))])",
    )
    assert [r for r, _, _ in samples] == [1, 0.5, 0.25, 0.1]
    for relative, width, opacity in samples:
        assert width == pytest.approx(MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * relative)
        assert opacity == pytest.approx(MIN_OPACITY + (1 - MIN_OPACITY) * relative)
    labels = page.eval_on_selector_all("#line-samples text", "els => els.map(e => e.textContent)")
    assert labels == ["largest", "50%", "25%", "10%"]
    assert page.is_visible("#line-samples")
    page.assert_quiet()


def test_page_writes_huge_numbers_as_explain_does(page):
    """From 1e10 up a number reads 1.0461e+29, as explain's tables write it, not as 30 digits."""
    data = explorer_data(build_trace(config()))
    query = data["query"]
    steps = data["layers"][0]["heads"][0]["steps"]
    huge = [104606934461309001593761300480.0, 9999999999.0, -2.5e12] + steps["scores"][query][3:]
    steps["scores"][query] = huge
    page.load(render_explorer(data))
    shown = cells(page, "score")
    assert shown[:3] == ["1.0461e+29", "9999999999.0000", "-2.5000e+12"]
    assert shown == fmt_all(huge, 4)
    page.assert_quiet()


def test_query_label_says_positions_count_from_zero(page):
    data = explorer_data(build_trace(config()))
    page.load(render_explorer(data))
    query = data["query"]
    assert page.text_content("#step-panel h2") == f"Query at position {query} (from 0): {data['tokens'][query]}"
    click_query(page, 0)
    assert page.text_content("#step-panel h2") == f"Query at position 0 (from 0): {data['tokens'][0]}"
    page.assert_quiet()


def test_all_heads_overlaid(page):
    data = explorer_data(build_trace(config("gqa", heads=4, kv_heads=2)))
    page.load(render_explorer(data))
    query, n = data["query"], len(data["tokens"])
    assert len(lines(page)) == n
    page.check("#all-heads")
    drawn = lines(page)
    assert len(drawn) == 4 * n
    # One absolute scale for all heads: each line's r is its weight, on 0..1.
    for h in range(4):
        assert_lines_match(page, weights_at(data, 0, h, query), 4, head=h, query=query, largest=1.0)
    largest = max(round(w, 4) for h in range(4) for w in weights_at(data, 0, h, query))
    widest = max(drawn, key=lambda line: line["width"])
    assert widest["weight"] == pytest.approx(largest)  # the strongest weight of any head draws the widest line
    assert largest < 0.5 and widest["width"] < 0.5 * MAX_WIDTH  # untrained heads: no line is drawn strong
    colours = {h: {line["stroke"] for line in drawn if line["head"] == h} for h in range(4)}
    assert all(len(c) == 1 for c in colours.values()), "one colour per head"
    assert len(set.union(*colours.values())) == 4, "distinct colours"
    legend = page.eval_on_selector_all("#legend li", "els => els.map(e => e.textContent)")
    assert legend == [head["name"] for head in data["layers"][0]["heads"]]
    assert page.text_content("#line-legend figcaption") == (
        "Line width and darkness: the weight itself, on one scale from 0 to 1 shared by every head (1 = full).")
    assert page.text_content("#line-largest") == (
        "All heads on one scale from 0 to 1: near-uniform heads draw faint lines. The largest weight of any head "
        f"for this query is {largest:.4f}.")
    samples = page.eval_on_selector_all("#line-samples .legend-line", LEGEND_SAMPLES_JS)
    for relative, width, opacity in samples:  # the key's lines are weights 1, 0.5, 0.25, 0.1 on the same scale
        assert width == pytest.approx(MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * relative)
    labels = page.eval_on_selector_all("#line-samples text", "els => els.map(e => e.textContent)")
    assert labels == ["weight 1", "weight 0.5", "weight 0.25", "weight 0.1"]
    click_query(page, 6)
    assert len(lines(page)) == 4 * n
    page.uncheck("#all-heads")
    assert len(lines(page)) == n
    assert page.is_hidden("#legend")
    assert page.text_content("#line-legend figcaption") == (
        "Line width and darkness: weight relative to this row's largest (largest = full).")
    labels = page.eval_on_selector_all("#line-samples text", "els => els.map(e => e.textContent)")
    assert labels == ["largest", "50%", "25%", "10%"]
    page.assert_quiet()


def test_overlay_draws_every_head_on_one_absolute_scale(page):
    """An untrained head (weights 0.137-0.149) beside a sure one (0.9): the untrained one's lines are faint.

    Scaled to its own largest, the 0.149 line would be drawn full width, as strong as the 0.9
    one; on the shared 0..1 scale its r is 0.149, and the 0.9 line is the strongest of all.
    """
    data = explorer_data(build_trace(config("multihead", heads=2)))
    n, query = len(data["tokens"]), data["query"]
    assert n == 7
    flat = [0.137, 0.149, 0.142, 0.143, 0.143, 0.143, 0.143]  # adds up to 1: an untrained head
    sure = [0.9, 0.02, 0.02, 0.02, 0.02, 0.01, 0.01]
    assert sum(flat) == pytest.approx(1.0) and sum(sure) == pytest.approx(1.0)
    for h, row in enumerate((flat, sure)):
        head = data["layers"][0]["heads"][h]
        head["weights"] = [row if i == query else [1.0 if j == i else 0.0 for j in range(n)] for i in range(n)]
        head["steps"] = None
    page.load(render_explorer(data))
    page.check("#all-heads")
    drawn = lines(page)
    assert len(drawn) == 2 * n
    for h, row in enumerate((flat, sure)):
        for line in (line for line in drawn if line["head"] == h):
            r = row[line["key"]]  # the weight itself
            assert line["width"] == pytest.approx(MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * r, abs=1e-6)
            assert line["opacity"] == pytest.approx(MIN_OPACITY + (1 - MIN_OPACITY) * r, abs=1e-6)
    widest = max(drawn, key=lambda line: line["width"])
    assert (widest["head"], widest["key"]) == (1, 0), "the largest weight of all draws the strongest line"
    assert max(line["width"] for line in drawn if line["head"] == 0) < 0.25 * MAX_WIDTH
    assert max(line["opacity"] for line in drawn if line["head"] == 0) < 0.3
    assert "0.9000" in page.text_content("#line-largest")
    page.uncheck("#all-heads")  # head 0 alone: back on its own row's scale, its 0.149 full
    alone = {line["key"]: line for line in lines(page)}
    assert alone[1]["width"] == pytest.approx(MAX_WIDTH)
    page.assert_quiet()


# ---- safety: tokens are text, nothing is fetched -------------------------------------------

# Tokens split on whitespace, so the markup that would run needs no spaces.
XSS_SENTENCE = (
    '<img/src/onerror=alert(1)> <svg/onload=alert(2)> </script><script>alert(3)</script> "q\'s" &amp; cat '
    "<img src=x onerror=alert(4)>"
)


def test_tokens_are_text_not_markup(page):
    cfg = ExplainConfig(sentence=XSS_SENTENCE, embed="random", dim=4)
    tokens = cfg.tokens
    assert {"<img/src/onerror=alert(1)>", "<svg/onload=alert(2)>", "</script><script>alert(3)</script>"} <= set(tokens)
    data = explorer_data(build_trace(cfg))
    page_html = render_explorer(data)
    assert "<img" not in page_html
    assert page_html.count("<script") == 2 and page_html.count("</script>") == 2
    page.load(page_html)
    assert page.title() == data["title"]
    assert page.text_content("#title") == data["title"]
    for kind in ("query", "key"):
        shown = page.eval_on_selector_all(f"text.token.{kind}", "els => els.map(e => e.textContent)")
        assert shown == tokens
    for i in range(len(tokens)):
        click_query(page, i)
        assert page.eval_on_selector_all("#step-table tbody th", "els => els.map(e => e.textContent)") == tokens
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    svgs = page.evaluate("[...document.querySelectorAll('svg')].map(e => e.id)")
    assert svgs == ["line-samples", "head-view"], "only the line key and the head view"
    assert page.evaluate("document.scripts.length") == 2
    assert page.dialogs == []
    page.assert_quiet()


def test_page_fetches_nothing_and_names_no_url():
    page_html = explorer_html(build_trace(ExplainConfig()))
    assert "http://" not in page_html and "https://" not in page_html
    assert "<link" not in page_html.lower()
    assert re.search(r"<script[^>]*\ssrc\s*=", page_html, re.IGNORECASE) is None
    assert "url(" not in page_html and "@import" not in page_html
    assert f'<meta http-equiv="Content-Security-Policy" content="{html_lib.escape(CONTENT_SECURITY_POLICY)}">' in page_html
    script = page_html.split("<script>", 1)[1]
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink


def test_data_json_cannot_close_its_script():
    data = {"tokens": ["</script>", "<!--", "a&b", "\u2028\u2029", "ü"], "n": [0.5, -1.0]}
    text = data_json(data)
    assert not set("<>&\u2028\u2029") & set(text)
    assert "ü" in text and ", " not in text
    assert json.loads(text) == data


def test_notebook_iframe_holds_the_page(page):
    page_html = explorer_html(build_trace(ExplainConfig()))
    frame_html = notebook_html(page_html)
    found = re.fullmatch(r'<iframe srcdoc="([^"]*)" (.*)></iframe>', frame_html, re.DOTALL)
    assert found, frame_html[:200]
    assert html_lib.unescape(found.group(1)) == page_html
    attributes = found.group(2)
    assert 'sandbox="allow-scripts"' in attributes and 'width="100%"' in attributes and "border: none" in attributes
    height = int(re.search(r'height="(\d+)"', attributes).group(1))
    assert 400 <= height <= 900
    assert 'height="321"' in notebook_html(page_html, height=321)
    assert notebook_explorer(build_trace(ExplainConfig())) == frame_html
    with pytest.raises(ValueError):
        notebook_html(page_html, height=0)

    page.load(frame_html)
    frame = page.frame_locator("iframe")
    assert frame.locator("line.attention-line").count() == 7
    assert frame.locator("text.token.query").nth(1).text_content() == "cat"
    page.assert_quiet()


# ---- size and speed ------------------------------------------------------------------------


def test_256_tokens_stay_responsive(page):
    cfg = ExplainConfig(sentence=" ".join(f"w{i}" for i in range(256)), embed="random", dim=8, format="json")
    data = explorer_data(build_trace(cfg))
    page_html = render_explorer(data)
    size = len(page_html.encode())
    page.load(page_html)
    assert float(page.get_attribute("#head-view", "height")) >= 256 * 20
    for query in (0, 100, 200, 255, 37):
        start = time.perf_counter()
        click_query(page, query)
        elapsed = time.perf_counter() - start
        assert elapsed < 2.0, f"selecting query {query} took {elapsed:.2f} s (page {size / 1e6:.2f} MB)"
        assert_lines_match(page, weights_at(data, 0, 0, query), 4, query=query)
        assert page.eval_on_selector_all("#step-table tbody tr", "els => els.length") == 256
    page.assert_quiet()


def synthetic_data(layers: int = 6, heads: int = 12, n: int = 64, dim: int = 16) -> dict:
    """explorer_data's layout for a model too big for the CLI, with steps for one head only."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=generator)
    layer_list = []
    for layer in range(layers):
        head_list = []
        for head in range(heads):
            scores = torch.randn(n, n, generator=generator) * 2
            weights = torch.softmax(scores, dim=-1)
            steps = None
            if layer == 0 and head == 0:
                row_max = scores.max(dim=-1).values
                exp = torch.exp(scores - row_max[:, None])
                steps = rounded(
                    {
                        "score_label": "q · k",
                        "scale": None,
                        "scores": scores,
                        "scaled": None,
                        "softmax_input": None,  # no mask: explorer_data leaves it out too
                        "max": row_max,
                        "exp": exp,
                        "exp_sum": exp.sum(dim=-1),
                        "context": weights @ x,
                    },
                    4,
                )
            head_list.append({"name": f"head {head}", "weights": rounded(weights, 4), "steps": steps})
        layer_list.append({"name": f"layer {layer}", "heads": head_list})
    return {
        "title": "synthetic 6 x 12 x 64",
        "variant": "multihead",
        "description": "Random weights in the explorer's layout.",
        "tokens": [f"t{i}" for i in range(n)],
        "query": 0,
        "precision": 4,
        "input": rounded(x, 4),
        "output": rounded(torch.randn(n, dim, generator=generator), 4),
        "mask": None,
        "layers": layer_list,
        "selected": {"layer": 0, "head": 0},
    }


def test_six_layers_of_twelve_heads_fit_in_three_megabytes(page):
    data = synthetic_data()
    page_html = render_explorer(data)
    size = len(page_html.encode())
    assert size < 3_000_000, f"page is {size / 1e6:.2f} MB"
    page.load(page_html)
    assert page.eval_on_selector_all("#layer option", "els => els.length") == 6
    assert page.eval_on_selector_all("#head option", "els => els.length") == 12
    assert header_columns(page) == ["score", "exp", "weight"]
    page.select_option("#layer", "5")
    page.select_option("#head", "11")
    assert_lines_match(page, weights_at(data, 5, 11, 0), 4, head=11, query=0)
    assert page.is_visible("#steps-left-out")
    page.check("#all-heads")
    assert len(lines(page)) == sum(
        1 for h in range(12) for w in weights_at(data, 5, h, 0) if w != 0
    ), f"page is {size / 1e6:.2f} MB"
    page.assert_quiet()


def test_recorder_sees_requests_errors_and_dialogs(page):
    """The recording that every test above relies on does catch what it should."""
    page.route("**/*", lambda route: route.abort())  # nothing leaves the browser
    page.load(
        '<img src="http://127.0.0.1:9/x.png">'
        "<script>console.error('logged'); alert('hi'); throw new Error('boom');</script>"
    )
    page.wait_for_timeout(50)
    assert [r.split(" ", 1)[1] for r in page.requests] == ["http://127.0.0.1:9/x.png"]
    assert page.dialogs == ["alert: hi"]
    assert any("boom" in e for e in page.page_errors)
    assert "logged" in page.console_errors
    with pytest.raises(AssertionError):
        page.assert_quiet()


# ---- the flash variant: the online softmax's blocks in the step panel -------------------

FLASH_ROW_JS = """rows => rows.map(r => ({
    block: r.dataset.block,
    cells: Object.fromEntries([...r.querySelectorAll("td[data-col]")].map(td => [td.dataset.col, td.textContent])),
    acc: [...r.querySelectorAll('.vector[data-col="flash_acc"] > span')].map(s => s.textContent)}))"""


@pytest.mark.parametrize("block_size, query, precision", [(2, 3, 4), (1, 2, 3), (3, 5, 5)])
def test_flash_page_shows_the_blocks_of_explain(page, block_size, query, precision):
    trace = build_trace(config("flash", block_size=block_size))
    page.load(explorer_html(trace, precision))
    page.wait_for_selector('#head-view[data-query="1"]', state="attached")
    click_query(page, query)
    ref = explain_json(config("flash", block_size=block_size, query=query))
    flash = ref["flash"]
    rows = page.eval_on_selector_all("#flash-table tbody tr", FLASH_ROW_JS)
    assert len(rows) == len(flash["blocks"]) == -(-len(ref["tokens"]) // block_size)
    for b, (row, block) in enumerate(zip(rows, flash["blocks"])):
        assert row["block"] == str(b)
        assert row["cells"] == {
            "flash_keys": ", ".join(block["tokens"]),
            "flash_block_max": fmt(block["block_max"], precision),
            "flash_m": fmt(block["m_after"], precision),
            "flash_r": fmt(block["rescale"], precision),
            "flash_l": fmt(block["l_after"], precision),
        }
        assert row["acc"] == fmt_all(block["acc_after"], precision)
    assert cells(page, "flash_output") == fmt_all(flash["output"][query], precision)
    assert cells(page, "flash_plain_output") == fmt_all(flash["plain_output"][query], precision)
    assert cells(page, "flash_lse") == [fmt(flash["lse"][query], precision)]
    assert cells(page, "from_lse") == fmt_all(flash["weights_from_lse"][query], precision)
    assert cells(page, "weight") == fmt_all(ref["query"]["weights"], precision)
    assert cells(page, "output") == fmt_all(ref["context"][query], precision)
    assert "scaled" not in header_columns(page)  # the seed's unscaled scores
    page.assert_quiet()


def test_flash_page_leaves_out_blocks_too_big_to_embed(page):
    cfg = ExplainConfig(sentence=" ".join(f"w{i}" for i in range(300)), embed="random", dim=3, variant="flash",
                        block_size=1, format="html")
    data = explorer_data(build_trace(cfg))
    assert data["flash"]["blocks"] is None and len(data["flash"]["lse"]) == 300
    page.load(render_explorer(data))
    page.wait_for_selector('#head-view[data-query="1"]', state="attached")
    assert page.is_visible("#flash-left-out")
    assert page.query_selector("#flash-table") is None
    assert cells(page, "flash_lse") == [fmt(data["flash"]["lse"][1], 4)]
    page.assert_quiet()
