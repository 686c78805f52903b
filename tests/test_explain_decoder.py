"""`selfattn explain --model FOLDER` for decoders: GPT-2, Llama, Mistral, Qwen2, Qwen3 and Gemma 3 checkpoints.

Reference: transformers' own model read from the same folder (eager attention, which
returns the attention probabilities), with forward hooks on its projections and norm
for the queries, keys and values before RoPE (on q_norm and k_norm where the family
normalises each head's q and k), and its tokenizer. The turn by RoPE is written here
("rotate half": feature c pairs with c + d_h/2) with the config's rope_theta (the layer
kind's, for Gemma 3), or with transformers' cos and sin where Llama 3's rescaled
frequencies apply; the scores are scaled by the attention layer's own ``scaling``. Each
checkpoint is tiny and random (tests/tiny_models.py): Llama has 2 key/value heads for 4
query heads and rope scaling, Mistral a sliding window of 5, Qwen2 one key/value head and
a window of 6 in its last layer, Qwen3 head_dim 24 and q/k norms, Gemma 3 a sliding layer
(window 5, RoPE base 20) then a full one (base 1e6), scores times 1/sqrt(12).
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
ROPE = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
# (family, layer) explained besides LAYER: Gemma 3's sliding layer has its own window and RoPE base.
EXTRA_LAYERS = [("gemma3_text", 0), ("qwen3", 0)]
FROM_ZERO = re.compile(r"from 0(?![.\d])")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    return {family: tiny_checkpoint(family, root / family) for family in (*DECODERS, "bert")}


@pytest.fixture(scope="module")
def runs(folders):
    """transformers on SENTENCE for each family: the model, ids, its outputs and what the hooks saw in a layer."""
    cache = {}

    def run(family, layer=LAYER):
        if (family, layer) not in cache:
            cache[family, layer] = reference_run(folders[family], layer)
        return cache[family, layer]

    return run


def reference_run(folder, layer=LAYER):
    model = reference_model(folder)  # eager attention
    ids = reference_tokenizer(folder)(SENTENCE, return_tensors="pt")["input_ids"]  # (1, n)
    seen = {}
    if model.config.model_type == "gpt2":
        block = model.transformer.h[layer]
        modules = {"norm": block.ln_1, "qkv": block.attn.c_attn}
    else:
        block = model.model.layers[layer]
        attention = block.self_attn
        q, k = (attention.q_norm, attention.k_norm) if hasattr(attention, "q_norm") else (attention.q_proj, attention.k_proj)
        modules = {"norm": block.input_layernorm, "q": q, "k": k, "v": attention.v_proj}
    hooks = [m.register_forward_hook(lambda _, __, out, name=name: seen.__setitem__(name, out[0].detach())) for name, m in modules.items()]
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    if "qkv" in seen:  # GPT-2 projects q, k and v with one matrix
        seen["q"], seen["k"], seen["v"] = seen.pop("qkv").split(model.config.n_embd, dim=-1)
    n = len(ids[0])
    for name in ("q", "k"):  # a q/k norm's output is per head: (n, heads, d_h) or (heads, n, d_h) -> (n, heads * d_h)
        if seen[name].dim() == 3:
            per_head = seen[name] if seen[name].shape[0] == n else seen[name].transpose(0, 1)
            seen[name] = per_head.reshape(n, -1)
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


def window_of(config, layer=LAYER) -> int | None:
    """This layer's sliding window by the config: Qwen2 names its windowed layers, Mistral windows all."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return config.sliding_window if types[layer] == "sliding_attention" else None
    return getattr(config, "sliding_window", None)


def head_width(config) -> int:
    """d_h: head_dim where the config gives it (Qwen3, Gemma 3), else hidden_size / heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def columns(tensor, head, d_h):
    return tensor[:, head * d_h:(head + 1) * d_h]  # (n, heads * d_h) -> (n, d_h)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def cos_sin(model, n, d_h, layer=LAYER):
    """RoPE's cos and sin per position, (n, d_h): from rope_theta (the layer kind's where each kind has
    its own), or transformers' own where the frequencies are rescaled."""
    rope = model.config.rope_parameters
    if "rope_theta" not in rope:  # one entry per kind of layer (Gemma 3)
        rope = rope[model.config.layer_types[layer]]
    if rope.get("rope_type", "default") == "default":
        inv_freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, d_h, 2, dtype=torch.float64) / d_h)  # (d_h/2,)
        angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq  # (n, 1) * (d_h/2,) -> (n, d_h/2)
        angles = torch.cat([angles, angles], dim=-1)  # feature c and c + d_h/2 turn together
        return angles.cos(), angles.sin()
    cos, sin = model.model.rotary_emb(torch.zeros(1, n, d_h), torch.arange(n)[None])  # llama3 scaling
    return cos[0].double(), sin[0].double()


@pytest.mark.parametrize(("family", "layer"), [(family, LAYER) for family in DECODERS] + EXTRA_LAYERS)
def test_json_matches_transformers(run_cli, folders, runs, family, layer):
    data = explain(run_cli, folders[family], "--layer", str(layer))
    model, ids, out, seen = runs(family, layer)
    config = model.config
    n, (heads, kv_heads) = len(ids), heads_of(config)
    d_h = head_width(config)
    kv = HEAD // (heads // kv_heads)
    assert data["input_ids"] == ids and data["family"] == config.model_type
    tokenizer = reference_tokenizer(folders[family])
    assert data["tokens"] == tokenizer.convert_ids_to_tokens(ids)
    assert data["readable"] == [tokenizer.decode([i]) for i in ids]
    assert data["special"] == [token in tokenizer.all_special_tokens for token in data["tokens"]]

    expected = out.attentions[layer][0, HEAD]  # (n, n)
    close(data["weights"], expected)
    weights = t(data["weights"])
    assert torch.equal(weights.triu(1), torch.zeros(n, n, dtype=torch.float64))  # causal: nothing above the diagonal
    close(weights.sum(-1), torch.ones(n), dict(atol=1e-6, rtol=0))
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    window = window_of(config, layer)
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

    close(data["layer_input"], out.hidden_states[layer][0])
    close(data["attention_input"], seen["norm"])
    q_proj, k_proj, v_proj = (columns(seen[name], h, d_h) for name, h in (("q", HEAD), ("k", kv), ("v", kv)))
    close(data["v"], v_proj)
    close(data["context"], expected @ v_proj)  # (n, n) @ (n, d_h)
    scaling = model.model.layers[layer].self_attn.scaling if family != "gpt2" else 1 / math.sqrt(d_h)
    assert data["scale"] == pytest.approx(scaling, rel=1e-7) and a["scale"] == pytest.approx(scaling, rel=1e-7)
    assert scaling != pytest.approx(1 / math.sqrt(d_h)) or family != "gemma3_text"  # Gemma's own scale is in play
    scores = t(data["q"]) @ t(data["k"]).T * scaling  # (n, d_h) @ (d_h, n)
    close(t(data["scores"])[allowed], scores[allowed], dict(atol=1e-4, rtol=1e-5))
    assert a["qk_norm"] == (family in ("qwen3", "gemma3_text"))
    assert a["sandwich_norm"] == (family == "gemma3_text") and a["norm_gain"] == ("1+w" if family == "gemma3_text" else "w")
    assert set(data["scores"][0][1:]) == {"-inf"}
    if family in ROPE:
        close(data["q_before_rope"], q_proj)
        close(data["k_before_rope"], k_proj)
        cos, sin = cos_sin(model, n, d_h, layer)
        assert a["rope_base"] == (config.rope_parameters.get("rope_theta")
                                  or config.rope_parameters[config.layer_types[layer]]["rope_theta"])
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
    if family == "gemma3_text":  # the token vectors times sqrt(width), the factor rounded to float32 as in the checkpoint
        width = model.config.hidden_size
        assert list(e["parts"]) == ["word"] and "no position vector" in e["note"] and f"√{width}" in e["note"]
        assert e["formula"] == f"E_tok[id] · √{width}"
        close(data["embeddings"], table[ids] * torch.tensor(width ** 0.5, dtype=torch.float32))
    elif family in ROPE:
        assert list(e["parts"]) == ["word"] and "no position vector" in e["note"] and e["formula"] == "E_tok[id]"
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
