"""Long inputs: every command takes what the model's positions allow, and says what it leaves out.

explain's text shows the query's own rows whole (checked against its JSON) and cuts the
other tables with a line naming what it left out; the JSON holds every row (checked
against transformers' BertModel, or the decoder's own forward pass); heads, compare, plot
and view run on the same inputs; ``--query`` counts a negative position from the end.
"""

from __future__ import annotations

import json
import re
import struct

import pytest
import torch

from selfattn.render.text.document import (
    HEAD_ROWS,
    SHOWN_COLUMNS,
    SHOWN_ROWS,
    TAIL_ROWS,
    TEXT_WIDTH,
    Paragraph,
    Table,
    shown_rows,
    token_matrix,
    token_span,
    token_table,
)

MINILM = "all-MiniLM-L6-v2"
DECODER = "tiny-shakespeare"  # character-level, 64 positions
# Every word is one WordPiece token of all-MiniLM-L6-v2.
WORDS = ("the old keeper climbed the narrow stairs every evening to light the lamp while the sea crashed "
         "against the rocks below and the birds circled overhead").split()
PAGE_LIMIT = 3_000_000  # bytes: a 512-token page stays about as big as a 64-token one
LEFT_OUT = re.compile(r"… left out: (?:(\d+) rows \(tokens ([\d, -]+)\))?(?: and )?(?:(\d+) columns \(tokens ([\d, -]+)\))?; "
                      r"--format json has them all\.")


def minilm_text(n_tokens: int) -> str:
    """A text of exactly n_tokens WordPiece tokens, [CLS] and [SEP] included."""
    return " ".join((WORDS * (n_tokens // len(WORDS) + 1))[: n_tokens - 2])


SHAKESPEARE = "To be, or not to be, that is the question: whether tis noble"  # 60 characters, 60 tokens
TOY = " ".join(f"w{i}" for i in range(60))


def run_ok(run_cli, *args) -> str:
    status, out, err = run_cli(*args)
    assert (status, err) == (0, ""), err
    return out


def explain_json(run_cli, *args) -> dict:
    return json.loads(run_ok(run_cli, "explain", *args, "--format", "json"))


def fmt(value: float, precision: int = 4) -> str:
    """As the tables print a number: fixed decimals, or scientific from 1e10 up and below 1e-10 (0 aside)."""
    if abs(value) >= 1e10 or 0 < abs(value) < 1e-10:
        return f"{value:.{precision}e}"
    text = f"{value:.{precision}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def positions(span: str) -> list[int]:
    """'16-29, 31-51' -> [16, ..., 29, 31, ..., 51]."""
    out = []
    for part in span.split(", "):
        first, _, last = part.partition("-")
        out += list(range(int(first), int(last or first) + 1))
    return out


def table_rows(text: str, heading: str, columns: int) -> list[list[str]]:
    """The rows of the first table after ``heading``: each row's last ``columns`` cells (numbers)."""
    after = text[text.index(heading):]
    lines = after.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    rows = []
    for line in lines[rule + 1:]:
        if not line.strip():
            break
        rows.append(line.split()[-columns:])
    return rows


# ---- the document's summarising rule -------------------------------------------------------


def test_rows_and_columns_that_fit_are_all_shown():
    labels = [f"t{i}" for i in range(SHOWN_COLUMNS)]
    blocks = token_matrix("A", labels, lambda i, j: f"{i}.{j}", 5)
    assert len(blocks) == 1 and blocks[0].columns == ["A"] + labels
    assert [row[0] for row in blocks[0].rows] == labels and blocks[0].highlight_row == 5
    assert shown_rows(SHOWN_ROWS, 3) == list(range(SHOWN_ROWS))
    assert token_table(["token"], SHOWN_ROWS, 3, lambda i: [str(i)])[0].rows == [[str(i)] for i in range(SHOWN_ROWS)]


@pytest.mark.parametrize("n, query", [(25, 0), (49, 30), (200, 199), (512, 100), (512, 5)])
def test_a_wide_matrix_keeps_its_ends_and_the_querys_row_and_says_what_it_left_out(n, query):
    labels = [f"w{i}" for i in range(n)]
    table, line = token_matrix("scores", labels, lambda i, j: fmt(i - j / 7), query, title="S",
                               extra=[("row sum", lambda i: "1.0000")])
    assert isinstance(table, Table) and isinstance(line, Paragraph)
    keys = [c for c in table.columns[1:-1] if c != "…"]
    assert table.columns[-1] == "row sum" and table.columns.count("…") == 1
    widths = [max(len(table.columns[c]), *(len(row[c]) for row in table.rows)) + 3 for c in range(len(table.columns))]
    assert sum(widths) + 1 <= TEXT_WIDTH  # as rich lays it out: every column and its padding
    assert keys[0] == "w0" and keys[-1] == f"w{n - 1}"  # the first and the last keys
    shown = [int(row[0][1:]) for row in table.rows if row[0] != "…"]
    assert query in shown and table.rows[table.highlight_row][0] == f"w{query}"
    expected_rows = list(range(n)) if n <= SHOWN_ROWS else sorted(
        set(range(HEAD_ROWS)) | {query} | set(range(n - TAIL_ROWS, n)))
    assert shown == expected_rows
    for row in table.rows:
        if row[0] != "…":  # every cell is the one of its row and column
            i = int(row[0][1:])
            cells = [cell for cell, name in zip(row[1:-1], table.columns[1:-1]) if name != "…"]
            assert cells == [fmt(i - int(name[1:]) / 7) for name in keys]
    found = LEFT_OUT.fullmatch(line.text)
    assert found, line.text
    left_rows = positions(found.group(2)) if found.group(2) else []
    assert left_rows == [i for i in range(n) if i not in shown] and int(found.group(1) or 0) == len(left_rows)
    assert positions(found.group(4)) == [j for j in range(n) if f"w{j}" not in keys]


def test_token_span_names_runs():
    assert token_span([3]) == "token 3"
    assert token_span([3, 4, 5, 9, 11, 12]) == "tokens 3-5, 9, 11-12"


# ---- explain -------------------------------------------------------------------------------


def test_toy_text_shows_the_querys_full_row_and_cuts_the_matrices(run_cli):
    text = run_ok(run_cli, "explain", TOY, "--embed", "random", "--dim", "4", "--query", "-1")
    data = explain_json(run_cli, TOY, "--embed", "random", "--dim", "4", "--query", "59")
    assert data["query"]["index"] == 59
    # Step 4's stable softmax: one row per key, every one of them, as the JSON has them.
    rows = table_rows(text, "The stable form", 3)
    assert len(rows) == 60
    assert [row[-1] for row in rows] == [fmt(w) for w in data["query"]["weights"]]
    # Step 3 writes every score; the context table of step 5 has every key's row.
    scores = re.findall(r"ω_60,(\d+) = .* = (\S+)   \(w\d+\)", text)
    assert [int(j) for j, _ in scores] == list(range(1, 61))
    assert [s for _, s in scores] == [fmt(s) for s in data["query"]["scores"]]
    assert len(table_rows(text, "Step 5 · The context vector", 5)) == 60
    # Step 6 cuts the 60 x 60 matrices: the first, the query's and the last rows, the first and last columns.
    cut = [LEFT_OUT.fullmatch(line) for line in text.splitlines() if line.startswith("… left out")]
    assert len(cut) >= 4 and all(cut), text
    assert positions(cut[0].group(2)) == list(range(16, 52))  # the query, 59, is among the last 8
    assert max(len(line) for line in text.splitlines()) <= TEXT_WIDTH
    # The whole JSON: every row of every matrix, equal to softmax(X Xᵀ) from its own X.
    x = torch.tensor(data["embeddings"], dtype=torch.float64)
    expected = torch.softmax(x @ x.T, dim=-1)
    assert len(data["weights"]) == 60 and all(len(row) == 60 for row in data["weights"])
    torch.testing.assert_close(torch.tensor(data["weights"], dtype=torch.float64), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("variant", ["causal", "gqa", "flash"])
def test_every_variant_explains_a_long_sentence_and_json_is_whole(run_cli, variant):
    sentence = " ".join(f"w{i}" for i in range(100))
    text = run_ok(run_cli, "explain", sentence, "--variant", variant, "--embed", "random", "--dim", "4",
                  "--query", "-3")
    assert "… left out:" in text and "'w97'" in text
    data = explain_json(run_cli, sentence, "--variant", variant, "--embed", "random", "--dim", "4", "--query", "97")
    weights = torch.tensor(data["weights"])
    assert weights.shape[-2:] == (100, 100)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0)


def test_many_heads_keep_within_the_head_cells(run_cli):
    sentence = " ".join(["w"] * 300)
    status, out, err = run_cli("explain", sentence, "--variant", "multihead", "--heads", "16", "--dim", "16")
    assert (status, out) == (2, "") and err.count("\n") == 1
    assert "with 16 heads the toy variants take at most 256" in err


@pytest.fixture(scope="module")
def reference():
    """transformers' BertModel (eager) on a text: (tokens, attentions)."""
    pytest.importorskip("transformers")
    from minilm_reference import HAVE_MODEL, reference as load_reference

    if not HAVE_MODEL:
        pytest.skip("the all-MiniLM-L6-v2 package is not installed")
    model, tokenizer, _ = load_reference()
    runs = {}

    def run(text: str):
        if text not in runs:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                out = model(input_ids=ids, output_attentions=True)
            runs[text] = (tokenizer.convert_ids_to_tokens(ids[0]), out.attentions)
        return runs[text]

    return run


def test_minilm_text_of_200_tokens(run_cli, reference):
    text = minilm_text(200)
    tokens, attentions = reference(text)
    out = run_ok(run_cli, "explain", text, "--model", MINILM, "--layer", "2", "--head", "5", "--query", "-1")
    data = explain_json(run_cli, text, "--model", MINILM, "--layer", "2", "--head", "5", "--query", "199")
    assert data["query"] == {"index": 199, "token": "[SEP]"} and data["tokens"] == tokens
    # The JSON is whole: every row, equal to transformers' own weights.
    assert len(data["weights"]) == 200 and all(len(row) == 200 for row in data["weights"])
    torch.testing.assert_close(torch.tensor(data["weights"], dtype=torch.float64), attentions[2][0, 5].double(),
                               atol=1e-5, rtol=0)
    # The text: the query's softmax row is whole, and its numbers are the JSON's.
    rows = table_rows(out, "Step 5 · Scaling and softmax", 4)
    assert len(rows) == 200
    assert [row[-1] for row in rows] == [fmt(w) for w in data["weights"][199]]
    assert [row[0] for row in rows] == [fmt(s) for s in data["scores_unscaled"][199]]
    assert len(table_rows(out, "Step 6 · Head 5's output", 9)) == 200
    # The tables of every token's vector are cut, and say so.
    assert "… left out: 176 rows (tokens 16-191); --format json has them all." in out
    assert "with '[SEP]' (position 199) as the query" in out


def test_decoder_text_of_60_characters(run_cli):
    from selfattn.models.loading import shared_model

    out = run_ok(run_cli, "explain", SHAKESPEARE, "--model", DECODER, "--layer", "1", "--head", "1", "--query", "-1")
    data = explain_json(run_cli, SHAKESPEARE, "--model", DECODER, "--layer", "1", "--head", "1", "--query", "-1")
    n = len(data["tokens"])
    assert n == 60 and data["query"]["index"] == n - 1
    model = shared_model(DECODER)
    with torch.no_grad():
        own = model(SHAKESPEARE, output_attentions=True).attentions[1][0, 1]  # (n, n): the model's forward pass
    torch.testing.assert_close(torch.tensor(data["weights"]), own.float(), atol=1e-6, rtol=0)
    rows = table_rows(out, "Step 5 · Scaling and softmax", 4)
    assert len(rows) == n and [row[-1] for row in rows] == [fmt(w) for w in data["weights"][n - 1]]
    assert "… left out: 36 rows (tokens 16-51); --format json has them all." in out


def test_a_negative_query_is_the_same_as_its_position(run_cli):
    for args in ((TOY, "--embed", "random", "--dim", "4"), (SHAKESPEARE, "--model", DECODER)):
        n = len(explain_json(run_cli, *args)["tokens"])
        for negative in (-1, -n, -7):
            counted = explain_json(run_cli, *args, "--query", str(negative))
            plain = explain_json(run_cli, *args, "--query", str(n + negative))
            assert counted == plain and counted["query"]["index"] == n + negative


@pytest.mark.parametrize("command", ["explain", "plot", "view", "compare"])
def test_a_query_out_of_range_names_both_ranges(run_cli, tmp_path, command):
    for query in ("-8", "7"):
        if command == "compare":
            args = ["compare", "The cat sat on the warm mat", "The cat sat on the warm mat", "--query", query]
        else:
            args = [command, "--query", query] + {"plot": ["--kind", "arrows", "-o", str(tmp_path / "a.png")],
                                                   "view": ["-o", str(tmp_path / "a.html")]}.get(command, [])
        status, out, err = run_cli(*args)
        assert (status, out) == (2, "") and err.count("\n") == 1 and "Traceback" not in err
        assert f"query position {query} is out of range" in err
        assert "positions 0 to 6, or -7 to -1 from the end" in err
    assert list(tmp_path.iterdir()) == []


def test_a_models_query_out_of_range_names_both_ranges(run_cli):
    for query in ("-61", "60"):
        status, out, err = run_cli("explain", SHAKESPEARE, "--model", DECODER, "--query", query)
        assert (status, out) == (2, "") and err.count("\n") == 1
        assert "positions 0 to 59, or -60 to -1 from the end" in err


# ---- heads and compare ---------------------------------------------------------------------


def test_heads_on_long_texts(run_cli):
    text = minilm_text(200)
    out = " ".join(run_ok(run_cli, "heads", text).split())  # the paragraph wraps
    assert "200 WordPiece tokens: [CLS] the old" in out
    assert "… the sea [SEP] (tokens 44-196 left out; --format json has them all)" in out
    data = json.loads(run_ok(run_cli, "heads", text, "--format", "json"))
    assert len(data["tokens"]) == 200 and len(data["heads"]) == 72
    out = " ".join(run_ok(run_cli, "heads", SHAKESPEARE, "--model", DECODER).split())
    assert "(tokens 44-56 left out; --format json has them all)" in out
    data = json.loads(run_ok(run_cli, "heads", SHAKESPEARE, "--model", DECODER, "--format", "json"))
    assert len(data["tokens"]) == 60


def test_compare_long_texts_with_a_query_from_the_end(run_cli):
    a, b = minilm_text(150), minilm_text(180)
    data = json.loads(run_ok(run_cli, "compare", a, b, "--query", "-2", "--model", MINILM, "--format", "json"))
    assert (data["query"]["index_a"], data["query"]["index_b"]) == (148, 178)
    out = run_ok(run_cli, "compare", a, b, "--query", "-2", "--model", MINILM)
    assert "#148" in out and "#178" in out
    toy = json.loads(run_ok(run_cli, "compare", TOY, TOY + " w60", "--query", "-1", "--variant", "multihead",
                            "--dim", "8", "--format", "json"))
    assert (toy["query"]["index_a"], toy["query"]["index_b"]) == (59, 60)


# ---- plot and view -------------------------------------------------------------------------


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("kind", ["heatmap", "arrows", "heads", "mask"])
def test_plots_of_long_inputs(run_cli, drawn, tmp_path, kind):
    text = minilm_text(200)
    path = tmp_path / f"{kind}.png"
    run_ok(run_cli, "plot", text, "--model", MINILM, "--kind", kind, "--query", "-1", "-o", str(path))
    width, height = png_size(path)
    assert 300 < width <= 32 * 150 and 300 < height <= 40 * 150
    figure = drawn[-1]
    if kind == "heatmap":
        ax = figure.axes[0]
        assert ax.get_xlabel() == "key (one token in 4 labelled, of 200)"
        assert len(ax.get_xticklabels()) == 50
    elif kind == "arrows":
        assert "'[SEP]'" in figure.axes[0].get_title()
        note = [t.get_text() for t in figure.texts]
        assert any(t.startswith("200 keys: the query and the 59 keys it weighs most are drawn") for t in note), note
    elif kind == "heads":
        assert "labelled, of 200" in figure.get_suptitle()
    else:
        assert "8x8 tiles" in figure.axes[0].get_title()  # 200 keys in at most 32 tiles a side


def test_arrows_keep_the_heaviest_keys_and_say_how_much_the_rest_hold():
    from selfattn.render.visual import plots

    weights = torch.softmax(torch.randn(100, generator=torch.Generator().manual_seed(0)), dim=0)
    tokens = [f"t{i}" for i in range(100)]
    figure = plots.arrows_figure(tokens, weights, -1)  # the last token, counted from the end
    drawn_keys = sorted(int(t.get_text().split(":")[0]) for t in figure.axes[0].texts[1:] if ":" in t.get_text())
    heaviest = set(torch.argsort(weights[:99], descending=True)[:plots.ARROW_KEYS - 1].tolist())
    assert drawn_keys == sorted(heaviest | {99})
    rest = 1 - float(weights[sorted(heaviest | {99})].sum())
    assert figure.texts[0].get_text().endswith(f"the other 40 hold {rest:.1%} of its weight.")


def test_heatmap_values_past_the_labels_are_left_out_with_a_note():
    from selfattn.render.visual import plots

    figure = plots.heatmap_figure(torch.full((61, 61), 1 / 61), [str(i) for i in range(61)], values=True)
    assert [t for t in figure.axes[0].texts] == []
    assert figure.texts[0].get_text().startswith("Cell values left out: 61 x 61 cells")


def view_data(run_cli, tmp_path, *args) -> tuple[int, dict]:
    from selfattn.render.visual.explorer import page_data

    path = tmp_path / "page.html"
    run_ok(run_cli, "view", *args, "-o", str(path))
    page = path.read_text(encoding="utf-8")
    return len(page.encode()), page_data(page)


def test_view_of_512_tokens_stays_small(run_cli, reference, tmp_path):
    text = minilm_text(512)
    size, data = view_data(run_cli, tmp_path, text, "--model", MINILM, "--layer", "1", "--head", "3", "--query", "-1")
    assert size < PAGE_LIMIT, f"the page is {size / 1e6:.2f} MB"
    assert len(data["tokens"]) == 512 and data["query"] == 511
    head = data["layers"][data["selected"]["layer"]]["heads"][data["selected"]["head"]]
    _, attentions = reference(text)
    torch.testing.assert_close(torch.tensor(head["weights"], dtype=torch.float64), attentions[1][0, 3].double(),
                               atol=0.5e-4 + 2e-5, rtol=0)  # every query's weights, at 4 decimals
    start, end = head["steps"]["rows"]
    assert end == 512 and 0 < start < 511  # a window of step rows, ending at the query
    assert all((row is None) == (i < start) for i, row in enumerate(head["steps"]["scores"]))
    assert f"queries {start} to 511 of 512" in data["description"]


@pytest.mark.parametrize("variant", ["simple", "causal", "gqa", "flash"])
def test_toy_view_of_512_tokens_stays_small(run_cli, tmp_path, variant):
    sentence = " ".join(f"w{i}" for i in range(512))
    size, data = view_data(run_cli, tmp_path, sentence, "--variant", variant, "--embed", "random", "--dim", "8",
                           "--query", "300")
    assert size < PAGE_LIMIT, f"the page is {size / 1e6:.2f} MB"
    assert data["query"] == 300 and len(data["layers"][0]["heads"][0]["weights"]) == 512
    start, end = data["layers"][0]["heads"][0]["steps"]["rows"]
    assert start <= 300 < end and end - start >= 40
    if variant == "causal":  # the mask as each query's range of keys: query i sees 0 .. i
        assert data["mask"] is None and data["layers"][0]["mask_ranges"] == [[0, i + 1] for i in range(512)]


def test_a_long_page_in_the_browser_says_which_rows_it_holds(tmp_path):
    from browser import chromium, recorded_page

    from selfattn.commands.explain_options import ExplainConfig
    from selfattn.commands.traces import build_trace
    from selfattn.render.visual.explorer import render_explorer
    from selfattn.render.visual.explorer_data import explorer_data

    trace = build_trace(ExplainConfig(sentence=" ".join(f"w{i}" for i in range(400)), embed="random", dim=4,
                                      variant="causal", query=-1, format="html"))
    data = explorer_data(trace)
    start, end = data["layers"][0]["heads"][0]["steps"]["rows"]
    assert end == 400 and start > 0
    with chromium() as browser, recorded_page(browser, viewport={"width": 1200, "height": 900}) as page:
        page.load(render_explorer(data))
        page.wait_for_selector('#head-view[data-query="399"]', state="attached")
        columns = page.eval_on_selector_all("#step-table thead th[data-col]", "els => els.map(e => e.dataset.col)")
        assert columns[0] == "score" and columns[-1] == "weight"
        page.click('text.token.query[data-index="3"]')
        page.wait_for_selector('#head-view[data-query="3"]', state="attached")
        note = page.text_content("#steps-row-left-out")
        assert f"this page holds them for queries {start} to 399" in note and "--query 3" in note
        assert page.eval_on_selector_all("#step-table thead th[data-col]", "els => els.map(e => e.dataset.col)") == ["weight"]
        assert page.eval_on_selector_all("#step-table tbody tr", "els => els.length") == 400
        page.assert_quiet()


def test_explain_takes_every_position_of_the_model_and_no_more(run_cli):
    text = "a" * 64  # tiny-shakespeare has 64 positions
    assert len(explain_json(run_cli, text, "--model", DECODER)["tokens"]) == 64
    status, out, err = run_cli("explain", text + "a", "--model", DECODER)
    assert (status, out) == (2, "") and err.count("\n") == 1 and "64 positions" in err
