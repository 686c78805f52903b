"""`selfattn explain --model FOLDER` for decoders: GPT-2, Llama, Mistral and Qwen2 checkpoints.

Reference: transformers' own model read from the same folder (eager attention, which
returns the attention probabilities), with forward hooks on its projections and norm
for the queries, keys and values before RoPE, and its tokenizer. The turn by RoPE is
written here ("rotate half": feature c pairs with c + d_h/2) with the config's
rope_theta, or with transformers' cos and sin where Llama 3's rescaled frequencies
apply. Each checkpoint is tiny and random (tests/tiny_models.py): Llama has 2 key/value
heads for 4 query heads and rope scaling, Mistral a sliding window of 5, Qwen2 one
key/value head and a window of 6 in its last layer.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from tiny_models import DECODERS, reference_model, reference_tokenizer, tiny_checkpoint

transformers = pytest.importorskip("transformers", reason="the decoder tests compare with transformers")

SENTENCE = "The cat sat on the warm mat"
LAYER, HEAD = 1, 3
TOL = dict(atol=1e-5, rtol=0)  # both sides compute in float32
ROPE = ("llama", "mistral", "qwen2")
FROM_ZERO = re.compile(r"from 0(?![.\d])")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    return {family: tiny_checkpoint(family, root / family) for family in (*DECODERS, "bert")}


@pytest.fixture(scope="module")
def runs(folders):
    """transformers on SENTENCE for each family: the model, ids, its outputs and what the hooks saw in layer LAYER."""
    cache = {}

    def run(family):
        if family not in cache:
            cache[family] = reference_run(folders[family])
        return cache[family]

    return run


def reference_run(folder):
    model = reference_model(folder)  # eager attention
    ids = reference_tokenizer(folder)(SENTENCE, return_tensors="pt")["input_ids"]  # (1, n)
    seen = {}
    if model.config.model_type == "gpt2":
        block = model.transformer.h[LAYER]
        modules = {"norm": block.ln_1, "qkv": block.attn.c_attn}
    else:
        block = model.model.layers[LAYER]
        modules = {"norm": block.input_layernorm, "q": block.self_attn.q_proj, "k": block.self_attn.k_proj, "v": block.self_attn.v_proj}
    hooks = [m.register_forward_hook(lambda _, __, out, name=name: seen.__setitem__(name, out[0].detach())) for name, m in modules.items()]
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    if "qkv" in seen:  # GPT-2 projects q, k and v with one matrix
        seen["q"], seen["k"], seen["v"] = seen.pop("qkv").split(model.config.n_embd, dim=-1)
    return model, ids[0].tolist(), out, seen


def explain(run_cli, folder, *args, fmt="json"):
    status, out, err = run_cli("explain", "--model", str(folder), "--layer", str(LAYER), "--head", str(HEAD),
                               "--format", fmt, *args, SENTENCE)
    assert status == 0, err
    assert err == ""
    return json.loads(out) if fmt == "json" else out


def t(value):
    """JSON numbers as a float64 tensor; JSON has no infinity, so -inf comes as the string "-inf"."""
    def number(v):
        return [number(x) for x in v] if isinstance(v, list) else float(v)

    return torch.as_tensor(number(value) if isinstance(value, list) else value, dtype=torch.float64)


def close(actual, expected, tol=TOL):
    torch.testing.assert_close(t(actual), t(expected), **tol)


def heads_of(config):
    heads = config.num_attention_heads
    return heads, getattr(config, "num_key_value_heads", None) or heads


def window_of(config) -> int | None:
    """This layer's sliding window by the config: Qwen2 names its windowed layers, Mistral windows all."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return config.sliding_window if types[LAYER] == "sliding_attention" else None
    return getattr(config, "sliding_window", None)


def columns(tensor, head, d_h):
    return tensor[:, head * d_h:(head + 1) * d_h]  # (n, heads * d_h) -> (n, d_h)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def cos_sin(model, n, d_h):
    """RoPE's cos and sin per position, (n, d_h): from rope_theta, or transformers' own where the frequencies are rescaled."""
    rope = model.config.rope_parameters
    if rope.get("rope_type", "default") == "default":
        inv_freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, d_h, 2, dtype=torch.float64) / d_h)  # (d_h/2,)
        angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq  # (n, 1) * (d_h/2,) -> (n, d_h/2)
        angles = torch.cat([angles, angles], dim=-1)  # feature c and c + d_h/2 turn together
        return angles.cos(), angles.sin()
    cos, sin = model.model.rotary_emb(torch.zeros(1, n, d_h), torch.arange(n)[None])  # llama3 scaling
    return cos[0].double(), sin[0].double()


@pytest.mark.parametrize("family", DECODERS)
def test_json_matches_transformers(run_cli, folders, runs, family):
    data = explain(run_cli, folders[family])
    model, ids, out, seen = runs(family)
    config = model.config
    n, (heads, kv_heads) = len(ids), heads_of(config)
    d_h = config.hidden_size // heads
    kv = HEAD // (heads // kv_heads)
    assert data["input_ids"] == ids and data["family"] == config.model_type
    tokenizer = reference_tokenizer(folders[family])
    assert data["tokens"] == tokenizer.convert_ids_to_tokens(ids)
    assert data["readable"] == [tokenizer.decode([i]) for i in ids]
    assert data["special"] == [token in tokenizer.all_special_tokens for token in data["tokens"]]

    expected = out.attentions[LAYER][0, HEAD]  # (n, n)
    close(data["weights"], expected)
    weights = t(data["weights"])
    assert torch.equal(weights.triu(1), torch.zeros(n, n, dtype=torch.float64))  # causal: nothing above the diagonal
    close(weights.sum(-1), torch.ones(n), dict(atol=1e-6, rtol=0))
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    window = window_of(config)
    if window is not None:
        rows, cols = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        allowed &= rows - cols < window  # a query sees its `window` newest keys
        assert n > window and not allowed[-1, 0]
    assert torch.equal(weights[~allowed], torch.zeros(int((~allowed).sum()), dtype=torch.float64))
    assert data["allowed"] == allowed.tolist()
    assert float(expected[allowed].min()) > 0  # a key in sight always gets some weight

    a = data["attention"]
    assert (a["causal"], a["norm_first"], a["n_heads"], a["n_kv_heads"], a["window"]) == (True, True, heads, kv_heads, window)
    assert a["kv_head"] == kv and a["group_size"] == heads // kv_heads
    assert a["positional"] == ("rope" if family in ROPE else "learned")
    assert data["first_token_share"] == pytest.approx(float(expected[1:, 0].mean()), abs=1e-6)

    close(data["layer_input"], out.hidden_states[LAYER][0])
    close(data["attention_input"], seen["norm"])
    q_proj, k_proj, v_proj = (columns(seen[name], h, d_h) for name, h in (("q", HEAD), ("k", kv), ("v", kv)))
    close(data["v"], v_proj)
    close(data["context"], expected @ v_proj)  # (n, n) @ (n, d_h)
    scores = t(data["q"]) @ t(data["k"]).T / math.sqrt(d_h)  # (n, d_h) @ (d_h, n)
    close(t(data["scores"])[allowed], scores[allowed], dict(atol=1e-4, rtol=1e-5))
    assert set(data["scores"][0][1:]) == {"-inf"}
    if family in ROPE:
        close(data["q_before_rope"], q_proj)
        close(data["k_before_rope"], k_proj)
        cos, sin = cos_sin(model, n, d_h)
        for name, plain in (("q", q_proj), ("k", k_proj)):
            close(data[name], plain.double() * cos + rotate_half(plain.double()) * sin)
    else:
        assert data["q_before_rope"] is None and data["k_before_rope"] is None
        close(data["q"], q_proj)
        close(data["k"], k_proj)


@pytest.mark.parametrize("family", DECODERS)
def test_json_embedding_parts(run_cli, folders, runs, family):
    data = explain(run_cli, folders[family])
    model, ids, out, _ = runs(family)
    e = data["embedding"]
    table = model.get_input_embeddings().weight
    close(e["parts"]["word"], table[ids])
    close(data["embeddings"], out.hidden_states[0][0])
    assert e["normalised"] is False
    if family in ROPE:
        assert list(e["parts"]) == ["word"] and "no position vector" in e["note"]
        close(data["embeddings"], table[ids])
    else:
        assert set(e["parts"]) == {"word", "position"}
        close(e["parts"]["position"], model.transformer.wpe.weight[: len(ids)])
        close(t(e["parts"]["word"]) + t(e["parts"]["position"]), out.hidden_states[0][0])


def prose(text):
    return " ".join(text.split())


@pytest.mark.parametrize("fmt", ["text", "markdown"])
@pytest.mark.parametrize("family", DECODERS)
def test_walkthrough_says_what_the_decoder_does(run_cli, folders, runs, family, fmt):
    out = explain(run_cli, folders[family], fmt=fmt)
    data = explain(run_cli, folders[family])
    flat = prose(out.replace("\\", ""))  # markdown escapes < > _ in tables
    model, ids, _, _ = runs(family)
    heads, kv_heads = heads_of(model.config)
    for banned in ("BERT", "WordPiece", "[CLS]", "[SEP]", "sentences with similar meaning"):
        assert banned not in out
    assert "decoder" in flat and "the causal mask hides every later token" in flat
    assert "byte-level BPE" in flat and "␣cat (Ġcat)" in flat
    assert "attention sink" in flat and "first token" in flat
    assert "randomly initialised checkpoint" in flat
    q = data["query"]["index"]
    seen = sum(data["allowed"][q])
    assert f"may see {seen} of the {len(ids)} keys" in flat
    assert re.search(rf"sum of α over the {seen} keys? it may see = 1\.0+\b", flat)
    assert f"puts {100 * data['weights'][q][0]:.2f}% on it" in flat  # the query's weight on token 0
    assert f"put on average {100 * data['first_token_share']:.2f}%" in flat
    assert ("RoPE" in flat) == (family in ROPE)
    assert ("RMSNorm" in flat) == (family in ROPE) and "pre-norm" in flat
    if kv_heads < heads:
        assert f"head {HEAD} reads key/value head {HEAD // (heads // kv_heads)}" in flat
        assert f"Every token's key in key/value head {HEAD // (heads // kv_heads)}" in flat
    else:
        assert "key/value head" not in flat
    window = window_of(model.config)
    assert (f"sliding window of {window}" in flat) == (window is not None)
    if family in ROPE:
        assert "depends on how far apart the two tokens are" in flat and "X₀ = E_tok[id]" in flat
    assert len(FROM_ZERO.findall(flat)) == 1
    if fmt == "text":
        assert max(len(line) for line in out.splitlines()) <= 100


def test_the_window_hides_older_keys_in_the_text(run_cli, folders):
    out = prose(explain(run_cli, folders["mistral"], "--query", "10", fmt="text"))
    assert "may see 5 of the 13 keys, positions 6 to 10" in out
    assert "sliding window of 5 keeps only the 5 newest keys, so the tokens before position 6 are hidden too" in out
    assert "hides token 0 from the 8 queries at positions 5 to 12" in out


def test_an_encoder_folder_is_no_minilm(run_cli, folders):
    out = prose(explain(run_cli, folders["bert"], fmt="text"))
    data = explain(run_cli, folders["bert"])
    assert "is an encoder" in out and "WordPiece" in out and "[CLS] at the front and [SEP] at the end" in out
    assert "sentences with similar meaning" not in out and "randomly initialised checkpoint" in out
    assert "causal" not in out and "RoPE" not in out and "attention sink" not in out
    assert data["allowed"] is None and data["q_before_rope"] is None and data["attention"]["causal"] is False
    assert data["embedding"]["normalised"] is True and set(data["embedding"]["parts"]) == {"word", "position", "type"}
    assert data["special"] == [token in ("[CLS]", "[SEP]") for token in data["tokens"]]
