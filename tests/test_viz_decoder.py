"""Pictures and the explorer for decoders (plot and view --model on tiny GPT-2 and Llama folders).

Reference: transformers' own GPT2LMHeadModel / LlamaForCausalLM read from the same folder
with eager attention (the implementation that returns the attention probabilities),
their fast tokenizer, and for RoPE transformers' own rotary embedding and
apply_rotary_pos_emb. Nothing is shared with our code but the files in the folder.
"""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the decoder tests compare with transformers")

from browser import chromium, recorded_page  # noqa: E402
from selfattn.render.visual import PLOT_KINDS  # noqa: E402
from selfattn.render.visual.explorer import page_data  # noqa: E402
from tiny_models import reference_model, reference_tokenizer, tiny_checkpoint  # noqa: E402

FAMILIES = ("gpt2", "llama")
SENTENCE = "The cat sat on the warm mat."
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One tiny random checkpoint per family, built once for the module."""
    return {family: tiny_checkpoint(family, tmp_path_factory.mktemp(family)) for family in FAMILIES}


@pytest.fixture(scope="module")
def reference(folders):
    """run(family, sentence) -> transformers' (tokens, ids, hidden states, attentions); run.models[family]."""
    models = {family: reference_model(folder) for family, folder in folders.items()}
    tokenizers = {family: reference_tokenizer(folder) for family, folder in folders.items()}
    runs = {}

    def run(family: str, sentence: str = SENTENCE):
        if (family, sentence) not in runs:
            ids = tokenizers[family](sentence, return_tensors="pt")["input_ids"]  # (1, n)
            with torch.no_grad():
                out = models[family](input_ids=ids, output_attentions=True, output_hidden_states=True)
            tokens = tokenizers[family].convert_ids_to_tokens(ids[0])
            runs[(family, sentence)] = (tokens, ids, out.hidden_states, out.attentions)
        return runs[(family, sentence)]

    run.models = models
    return run


def assert_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 300 and height > 300


def future(n: int) -> np.ndarray:
    """(n, n) bool: True where the key comes after the query, what a causal mask hides."""
    return np.triu(np.ones((n, n), dtype=bool), k=1)


def legend_texts(figure) -> list[str]:
    return [t.get_text() for legend in figure.legends for t in legend.get_texts()]


# ---- plot --------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", PLOT_KINDS)
def test_every_kind_with_a_decoder_writes_a_png_or_says_why_not(run_cli, folders, tmp_path, family, kind):
    path = tmp_path / "picture.png"
    status, out, err = run_cli("plot", SENTENCE, "--model", str(folders[family]), "--kind", kind, "-o", str(path))
    if kind == "rope-distance" and family == "gpt2":  # learned positions: nothing for RoPE to turn
        assert (status, out) == (2, "") and err.count("\n") == 1, err
        assert "has no RoPE" in err and "--kind positional" in err
        assert not path.exists()
        return
    if kind == "training":  # draws a training run's folder, not a sentence
        assert (status, out) == (2, "") and err.count("\n") == 1 and "--training" in err, err
        assert not path.exists()
        return
    assert (status, err) == (0, ""), err
    assert_png(path)


@pytest.mark.parametrize("family", FAMILIES)
def test_heatmap_greys_the_future_and_shows_the_models_weights(run_cli, folders, reference, drawn, tmp_path, family):
    status, _, err = run_cli("plot", SENTENCE, "--model", str(folders[family]), "--layer", "1", "--head", "2",
                             "--kind", "heatmap", "-o", str(tmp_path / "h.png"))
    assert (status, err) == (0, "")
    tokens, _, _, attentions = reference(family)
    expected = attentions[1][0, 2].double().numpy()
    image = drawn[0].axes[0].images[0].get_array()
    n = len(tokens)
    assert np.array_equal(np.ma.getmaskarray(image), future(n))
    np.testing.assert_allclose(image.data[~future(n)], expected[~future(n)], atol=1e-5, rtol=0)
    assert np.all(expected[future(n)] == 0)  # what transformers gives where the mask hides
    assert "hidden by the causal mask" in legend_texts(drawn[0])
    labels = [t.get_text() for t in drawn[0].axes[0].get_xticklabels()]
    assert "Ġcat" in tokens and "␣cat" in labels and "Ġcat" not in labels  # readable, with the space shown
    assert len(labels) == n


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_grid_and_arrows_hide_the_future(run_cli, folders, reference, drawn, tmp_path, family):
    folder = str(folders[family])
    assert run_cli("plot", SENTENCE, "--model", folder, "--kind", "heads", "-o", str(tmp_path / "g.png"))[0] == 0
    tokens, _, _, attentions = reference(family)
    n = len(tokens)
    panels = [ax for ax in drawn[0].axes if ax.images]
    assert len(panels) == 2 * 4
    for index, ax in enumerate(panels):
        layer, head = divmod(index, 4)
        image = ax.images[0].get_array()
        assert np.array_equal(np.ma.getmaskarray(image), future(n))
        np.testing.assert_allclose(image.filled(0.0), attentions[layer][0, head].double().numpy(), atol=1e-5, rtol=0)

    status, _, err = run_cli("plot", SENTENCE, "--model", folder, "--query", "cat", "--layer", "1", "--head", "3",
                             "--kind", "arrows", "-o", str(tmp_path / "a.png"))
    assert (status, err) == (0, "")
    q = tokens.index("Ġcat")  # found by the way it reads
    ax = drawn[1].axes[0]
    numbers = [float(t.get_text()) for t in ax.texts if re.fullmatch(r"\d\.\d{3}", t.get_text())]
    torch.testing.assert_close(torch.tensor(numbers, dtype=torch.float64), attentions[1][0, 3, q, : q + 1].double(),
                               atol=0.0005 + 1e-6, rtol=0)
    assert len(ax.patches) == q + 1  # an arrow to each visible key, none to a later one
    assert [t.get_text() for t in ax.texts].count("hidden") == n - 1 - q


def test_positional_is_gpt2s_learned_table(run_cli, folders, reference, drawn, tmp_path):
    status, _, err = run_cli("plot", "--model", str(folders["gpt2"]), "--kind", "positional", "-o", str(tmp_path / "p.png"))
    assert (status, err) == (0, "")
    table = reference.models["gpt2"].transformer.wpe.weight.detach()[:64, :64].double().numpy()
    image = drawn[0].axes[0].images[0]
    np.testing.assert_allclose(image.get_array(), table, atol=1e-7, rtol=0)
    assert "learned position embeddings" in drawn[0].axes[0].get_title()


def test_positional_of_llama_is_its_own_rope(run_cli, folders, reference, drawn, tmp_path):
    """No table: the picture is RoPE's cos / sin at every position, as transformers' rotary embedding gives them."""
    status, _, err = run_cli("plot", "--model", str(folders["llama"]), "--kind", "positional", "-o", str(tmp_path / "p.png"))
    assert (status, err) == (0, "")
    model = reference.models["llama"]
    d_head = model.config.hidden_size // model.config.num_attention_heads
    positions = torch.arange(64)[None]  # (1, 64): the tiny model has 64 positions
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(torch.zeros(1, 64, d_head), positions)  # (1, 64, d_head) each, llama3-scaled
    half = d_head // 2
    expected = torch.cat([cos[0, :, :half], sin[0, :, half:]], dim=-1).double().numpy()  # pairs (i, i + d/2)
    ax = drawn[0].axes[0]
    np.testing.assert_allclose(ax.images[0].get_array(), expected, atol=1e-5, rtol=0)  # float32 angles up to 63
    title = " ".join(ax.get_title().split())
    assert "no position table" in title and "500000" in title


def test_rope_distance_of_llama_is_transformers_score_at_every_shift(run_cli, folders, reference, drawn, tmp_path):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    status, _, err = run_cli("plot", SENTENCE, "--model", str(folders["llama"]), "--query", "cat", "--head", "3",
                             "--kind", "rope-distance", "-o", str(tmp_path / "r.png"))
    assert (status, err) == (0, "")
    tokens, _, hidden, _ = reference("llama")
    model = reference.models["llama"]
    qi, ki = tokens.index("Ġcat"), 0  # the query and the first other token
    d_head, kv = 16, 3 // 2  # head 3 reads key/value head 1 (4 query heads, 2 key/value heads)
    attention = model.model.layers[0].self_attn
    with torch.no_grad():
        x = model.model.layers[0].input_layernorm(hidden[0])  # (1, n, 64)
        q = attention.q_proj(x).view(1, -1, 4, d_head).transpose(1, 2)[:, 3:4, qi:qi + 1]  # (1, 1, 1, 16)
        k = attention.k_proj(x).view(1, -1, 2, d_head).transpose(1, 2)[:, kv:kv + 1, ki:ki + 1]
        grid = drawn[0].axes[0].images[0].get_array()
        for i, j in ((qi, ki), (5, 2), (9, 0), (3, 7)):
            cos_i, sin_i = model.model.rotary_emb(x, torch.tensor([[i]]))
            cos_j, sin_j = model.model.rotary_emb(x, torch.tensor([[j]]))
            q_i, _ = apply_rotary_pos_emb(q, q, cos_i, sin_i)
            _, k_j = apply_rotary_pos_emb(k, k, cos_j, sin_j)
            assert grid[i, j] == pytest.approx(float((q_i * k_j).sum()), abs=1e-4)
    assert max(len(tokens), 16) == grid.shape[0]


def test_bad_decoder_requests_are_one_line_exit_2(run_cli, folders, tmp_path):
    folder = str(folders["llama"])
    for args, message in (
        (["plot", "--kind", "heatmap", "--head", "4"], "--head must be from 0 to 3 for this model, got 4"),
        (["plot", "--kind", "positional", "--layer", "2"], "--layer must be from 0 to 1"),
        (["plot", "--kind", "positional", "--dim", "8"], "--dim does not apply with --model"),
        (["view", "--layer", "5"], "--layer must be from 0 to 1"),
        (["plot", "--kind", "arrows", "--query", "dog"], "'dog' is not among the model's tokens"),
    ):
        output = tmp_path / ("out.html" if args[0] == "view" else "out.png")
        status, out, err = run_cli(*args, "--model", folder, "-o", str(output))
        assert status == 2 and out == "" and err.count("\n") == 1, err
        assert message in err, err
        assert list(tmp_path.iterdir()) == []


# ---- view --------------------------------------------------------------------------------


def view_page(run_cli, folders, tmp_path, family, *args) -> tuple[str, dict]:
    path = tmp_path / f"{family}.html"
    status, _, err = run_cli("view", SENTENCE, "--model", str(folders[family]), *args, "-o", str(path))
    assert (status, err) == (0, ""), err
    page = path.read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page and "<link" not in page.lower()
    return page, page_data(page)


@pytest.mark.parametrize("family", FAMILIES)
def test_page_holds_transformers_weights_the_causal_mask_and_readable_tokens(run_cli, folders, reference, tmp_path,
                                                                            family):
    _, data = view_page(run_cli, folders, tmp_path, family, "--layer", "1", "--head", "1")
    tokens, _, _, attentions = reference(family)
    n = len(tokens)
    assert data["tokens"] == tokens  # the vocabulary's own spelling: 'Ġcat'
    assert data["labels"][tokens.index("Ġcat")] == "␣cat"
    for l, layer in enumerate(data["layers"]):
        assert layer["mask_ranges"] == [[0, i + 1] for i in range(n)]  # query i sees keys 0 .. i
        assert layer["mask_label"] == "hidden by the causal mask"
        for h, head in enumerate(layer["heads"]):
            weights = torch.tensor(head["weights"], dtype=torch.float64)
            torch.testing.assert_close(weights, attentions[l][0, h].double(), atol=1e-4, rtol=0)
            assert torch.all(weights[torch.from_numpy(future(n))] == 0)
            share = float(attentions[l][0, h][1:, 0].mean())
            assert head["first_token_share"] == pytest.approx(share, abs=1e-4)
            assert f"{100 * share:.0f}% of their weight on it" in head["description"]
            softmax_input = head["steps"]["softmax_input"]  # each head's steps, from the model's own blocks
            assert all(softmax_input[i][j] == "-inf" for i in range(n) for j in range(i + 1, n))
    assert "causal" in data["description"] and "WordPiece" not in data["description"]


def test_llama_page_names_the_key_value_head_each_query_head_reads(run_cli, folders, reference, tmp_path):
    _, data = view_page(run_cli, folders, tmp_path, "llama")
    config = reference.models["llama"].config
    group = config.num_attention_heads // config.num_key_value_heads  # transformers' repeat_kv groups
    for layer in data["layers"]:
        for h, head in enumerate(layer["heads"]):
            assert head["kv_head"] == h // group
            assert head["name"] == f"head {h} (kv {h // group})"
            assert f"reads key/value head {h // group}" in head["description"]
    assert "RoPE" in data["description"] and "2 key/value heads" in data["description"]


def test_browser_greys_the_keys_after_the_query(run_cli, folders, tmp_path):
    page_html, data = view_page(run_cli, folders, tmp_path, "llama")
    query = data["tokens"].index("Ġcat")
    with chromium() as browser, recorded_page(browser, viewport={"width": 1200, "height": 900}) as page:
        page.load(page_html)
        page.click(f'#head-view .token.query[data-index="{query}"]')
        hidden = page.eval_on_selector_all("#head-view .token.key.hidden", "els => els.map(e => Number(e.dataset.index))")
        assert hidden == list(range(query + 1, len(data["tokens"])))
        keys = page.eval_on_selector_all("line.attention-line", "els => els.map(e => Number(e.dataset.key))")
        assert keys and max(keys) <= query
        assert "hidden by the causal mask" in page.text_content("#mask-key")
        shown = page.text_content(f'#head-view .token.query[data-index="{query}"]')
        tip = page.text_content(f'#head-view .queries g:has(> .token[data-index="{query}"]) > title')
        assert (shown, tip) == ("␣cat", f'token {query}: "Ġcat"')
        assert "key/value head" in page.text_content("#head-note")
        page.assert_quiet()


def test_byte_tokens_that_are_no_character_alone_show_their_bytes(run_cli, folders, reference, drawn, tmp_path):
    """The tiny BPE knows no 'é': it is two byte tokens, 'Ã' and '©', each drawn as its byte."""
    sentence = "a café 日本"
    status, _, err = run_cli("plot", sentence, "--model", str(folders["gpt2"]), "--kind", "heatmap",
                             "-o", str(tmp_path / "b.svg"))
    assert (status, err) == (0, "")
    tokens = reference("gpt2", sentence)[0]
    labels = [t.get_text() for t in drawn[0].axes[0].get_xticklabels()]
    assert len(labels) == len(tokens)
    assert list("é".encode()) == [0xC3, 0xA9]
    assert "<0xC3>" in labels and "<0xA9>" in labels and "\ufffd" not in "".join(labels)
    assert "<0xE6>" in labels  # the first byte of 日
