"""Qwen3 and Gemma 3: what they add to the blocks, checked against transformers and by hand.

Qwen3 and Gemma 3 put an RMSNorm on each head's q and k before RoPE; Gemma 3 also scales
its scores by 1 / sqrt(query_pre_attn_scalar), normalises with a gain of 1 + w, adds norms
after attention and feed-forward, gates with the tanh GELU, multiplies its embeddings by
sqrt(d) and turns its sliding and full layers with different RoPE bases. The module tests
compare every attention path (the stacked no-grad projection, the plain one, the flash
kernel, the packed training path, the traced steps) with attention written out here and
torch's SDPA; the model tests compare the tiny random checkpoints of tests/tiny_models.py
with transformers' eager attention, through our flash kernel too, and show that each
Gemma difference is seen by those checkpoints (leaving one out moves the logits).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from selfattn.attention.config import AttentionConfig, TransformerConfig
from selfattn.attention.norm_and_mlp import GatedFeedForward, RMSNorm, rms_norm
from selfattn.attention.modules import MultiHeadAttention
from selfattn.attention.transformer import TransformerBlock
from selfattn.errors import ConfigError, ModelError

NEWER = ("qwen3", "gemma3_text")
TEXTS = ["The cat sat on the warm mat and the dog lay by the door.", "A dog", "Queries ask, keys answer."]


# ----------------------------------------------------------------------------- by hand


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope_by_hand(x, base):
    """x (batch, heads, n, d) turned to positions 0 .. n-1, pairs (c, c + d/2)."""
    n, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv  # (n, d/2)
    angles = torch.cat([angles, angles], dim=-1).to(x.dtype)  # (n, d)
    return x * angles.cos() + rotate_half(x) * angles.sin()


def rms_by_hand(x, w, eps, one_plus):
    g = 1 + w if one_plus else w
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def attention_by_hand(mha: MultiHeadAttention, x, causal=True):
    """The module's attention written out, softmax by torch's SDPA: (batch, n, d_model) -> (batch, n, d_model)."""
    c = mha.config
    b, n, _ = x.shape
    q = mha.w_q(x).view(b, n, c.n_heads, c.d_head).transpose(1, 2)  # (b, H, n, d_head)
    k = mha.w_k(x).view(b, n, c.n_kv_heads, c.d_head).transpose(1, 2)  # (b, Hkv, n, d_head)
    v = mha.w_v(x).view(b, n, c.n_kv_heads, c.d_head).transpose(1, 2)
    if c.qk_norm:
        one_plus = c.norm_gain == "1+w"
        q = rms_by_hand(q, mha.q_norm.weight, c.norm_eps, one_plus)
        k = rms_by_hand(k, mha.k_norm.weight, c.norm_eps, one_plus)
    if c.positional == "rope":
        q, k = rope_by_hand(q, c.rope_base), rope_by_hand(k, c.rope_base)
    k, v = (t.repeat_interleave(c.group_size, dim=1) for t in (k, v))  # (b, H, n, d_head)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=c.scale)  # (b, H, n, d_head)
    return mha.w_o(out.transpose(1, 2).reshape(b, n, -1))


def module(dtype=torch.float64, **options):
    settings = dict(d_model=12, n_heads=4, n_kv_heads=2, d_head=6, positional="rope", rope_pairs="half", rope_base=50.0)
    torch.manual_seed(0)
    mha = MultiHeadAttention.from_config(AttentionConfig(**{**settings, **options})).to(dtype)
    with torch.no_grad():
        for p in mha.parameters():
            p.add_(0.3 * torch.randn_like(p))  # gains and biases off their starting values
    return mha


SETTINGS = {
    "qk_norm (Qwen3)": dict(qk_norm=True, norm_eps=1e-6),
    "qk_norm 1+w, scale (Gemma 3)": dict(qk_norm=True, norm_gain="1+w", scale=0.3, bias=False),
    "scale only": dict(scale=0.7),
    "scale, no RoPE": dict(scale=0.2, positional="none"),
}


@pytest.mark.parametrize("impl", ["reference", "flash"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_every_path_of_the_module_is_the_attention_by_hand(setting, impl):
    mha = module(**SETTINGS[setting], attn_impl=impl)
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    expected = attention_by_hand(mha, x)
    with torch.no_grad():  # the stacked projection (the scale folded into W_q only without a q norm)
        torch.testing.assert_close(mha(x, is_causal=True), expected, atol=1e-12, rtol=1e-12)
        assert mha.path_for(x, is_causal=True).name == impl
        out, weights = mha(x, is_causal=True, need_weights=True)
        torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)
    steps = mha.steps(x, is_causal=True)  # the traced path: what explain shows
    torch.testing.assert_close(steps.output, expected, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(steps.attention.weights, weights, atol=1e-12, rtol=0)
    assert steps.attention.scale == pytest.approx(mha.config.score_scale, rel=1e-15)
    if mha.config.positional == "rope":  # q_plain: after the norm, before RoPE
        torch.testing.assert_close(rope_by_hand(steps.q_plain, mha.config.rope_base), steps.q, atol=1e-12, rtol=0)
    # With gradients: the plain projection (or the packed path), and the same gradients as by hand.
    x.requires_grad_(True)
    grad = torch.randn(2, 7, 12, dtype=torch.float64)
    ours = torch.autograd.grad((mha(x, is_causal=True) * grad).sum(), [x, *mha.parameters()])
    theirs = torch.autograd.grad((attention_by_hand(mha, x) * grad).sum(), [x, *mha.parameters()])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_the_packed_path_takes_a_scale_and_declines_a_head_norm():
    mha = module(scale=0.2, positional="none", bias=True, n_kv_heads=None)  # the packed path takes no grouped heads
    x = torch.randn(2, 5, 12, dtype=torch.float64, requires_grad=True)
    assert mha.path_for(x, is_causal=True).name == "packed"
    grad = torch.randn(2, 5, 12, dtype=torch.float64)
    ours = torch.autograd.grad((mha(x, is_causal=True) * grad).sum(), [x, *mha.parameters()])
    theirs = torch.autograd.grad((attention_by_hand(mha, x) * grad).sum(), [x, *mha.parameters()])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    normed = module(qk_norm=True, positional="none")
    choice = normed.path_for(x, is_causal=True)
    assert choice.name == "reference" and choice.declined["packed"] == "the module normalises each head's q and k (qk_norm)"


def test_a_cached_decode_with_head_norms_equals_the_full_pass():
    from selfattn.attention.kv_cache import KVCache

    mha = module(qk_norm=True, norm_gain="1+w", scale=0.4)
    x = torch.randn(1, 9, 12, dtype=torch.float64)
    cache = KVCache()
    with torch.no_grad():
        pieces = [mha(x[:, :4], is_causal=True, cache=cache)]  # a prompt of 4, then one token at a time
        pieces += [mha(x[:, i:i + 1], is_causal=True, cache=cache) for i in range(4, 9)]
        torch.testing.assert_close(torch.cat(pieces, dim=1), mha(x, is_causal=True), atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------- the block's pieces


def test_rms_norm_with_gain_one_plus_w_is_gemmas():
    pytest.importorskip("transformers", reason="the reference is transformers' Gemma3RMSNorm")
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    torch.manual_seed(1)
    theirs = Gemma3RMSNorm(10, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_(0, 0.5)
    ours = RMSNorm(10, 1e-6, gain="1+w")
    assert torch.equal(ours.weight, torch.zeros(10))  # a gain of 1 to start with
    ours.weight.data.copy_(theirs.weight.data)
    for dtype in (torch.float32, torch.bfloat16):
        x = (3 * torch.randn(4, 5, 10)).to(dtype)
        with torch.no_grad():
            assert torch.equal(ours.to(dtype)(x), theirs.to(dtype)(x))  # the same order of operations
    x = torch.randn(3, 10, dtype=torch.float64)
    torch.testing.assert_close(rms_norm(x, ours.weight.double(), 1e-6, "1+w"),
                               rms_by_hand(x, ours.weight.double(), 1e-6, True), atol=1e-14, rtol=0)


def test_the_tanh_gelu_gate_is_gemmas_feed_forward():
    ff = GatedFeedForward(8, 16, activation="geglu_tanh").double()
    x = torch.randn(3, 8, dtype=torch.float64)
    gate, up = x @ ff.gate.weight.T, x @ ff.up.weight.T  # (3, 16) each
    tanh_gelu = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))  # Hendrycks and Gimpel
    expected = (tanh_gelu * up) @ ff.down.weight.T
    with torch.no_grad():
        torch.testing.assert_close(ff(x), expected, atol=1e-12, rtol=0)
    x.requires_grad_(True)
    torch.testing.assert_close(ff(x), expected, atol=1e-12, rtol=0)
    with pytest.raises(ConfigError, match="GatedFeedForward takes swiglu, geglu_tanh"):
        GatedFeedForward(8, 16, activation="gelu")


def test_a_sandwich_block_normalises_both_outputs_before_adding_them():
    config = TransformerConfig(8, 2, d_ff=16, norm="rms", norm_gain="1+w", sandwich_norm=True, activation="geglu_tanh",
                               bias=False, causal=True, qk_norm=True, scale=0.25)
    torch.manual_seed(2)
    block = TransformerBlock(config).double()
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    h = x + block.post_attention_norm(attention_by_hand(block.attention, block.norm1(x)))
    expected = h + block.post_feedforward_norm(block.feed_forward(block.norm2(h)))
    with torch.no_grad():
        torch.testing.assert_close(block(x), expected, atol=1e-12, rtol=0)
    assert [n.gain for n in (block.norm1, block.norm2, block.attention.q_norm)] == ["1+w"] * 3


@pytest.mark.parametrize(("options", "match"), [
    (dict(norm_gain="1+w"), "norm_gain '1\\+w' is a gain of RMSNorm: give norm='rms' with it"),
    (dict(norm="rms", norm_gain="w+1"), "unknown norm gain 'w\\+1'"),
    (dict(sandwich_norm=True, norm_first=False), "sandwich_norm adds norms to a pre-LN block"),
    (dict(scale=0.0), "scale must be a positive number, got 0.0"),
    (dict(scale=float("nan")), "scale must be a positive number"),
    (dict(qk_norm=1), "qk_norm must be True or False"),
    (dict(activation="geglu"), "unknown activation 'geglu'"),
])
def test_invalid_settings_cannot_be_built(options, match):
    with pytest.raises(ConfigError, match=match):
        TransformerConfig(8, 2, **options)


# ----------------------------------------------------------------------------- the checkpoints


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    pytest.importorskip("transformers", reason="the checkpoints are made and checked with transformers")
    from tiny_models import tiny_checkpoint

    return {family: tiny_checkpoint(family, tmp_path_factory.mktemp(family)) for family in NEWER}


def batch(folder):
    from tiny_models import position_ids, reference_tokenizer

    encoded = dict(reference_tokenizer(folder, "left")(TEXTS, return_tensors="pt", padding=True))
    return encoded, position_ids(encoded["attention_mask"])


def differences(ours, theirs, mask):
    """The largest |ours - theirs| at real tokens: logits, hidden states, attention weights."""
    real = mask.bool()
    pairs = real[:, None, :, None] & real[:, None, None, :]
    return (
        float((ours.logits[real] - theirs.logits[real]).abs().max()),
        max(float((a[real] - b[real]).abs().max()) for a, b in zip(ours.hidden_states, theirs.hidden_states)),
        max(float((a[pairs.expand_as(a)] - b[pairs.expand_as(b)]).abs().max()) for a, b in zip(ours.attentions, theirs.attentions)),
    )


@pytest.mark.parametrize("family", NEWER)
def test_the_flash_kernel_in_the_model_matches_transformers(family, folders):
    """load_pretrained runs prompts of 128 tokens and more on the kernel; here every call does."""
    import dataclasses

    import selfattn as sa
    from tiny_models import reference_model

    model = sa.load_pretrained(folders[family])
    for layer in model.layers:  # FLASH_MIN_QUERIES (128) would send these short prompts the reference way
        layer.attention.config = dataclasses.replace(layer.attention.config, flash_min_queries=1)
    assert model.layers[0].attention.path_for(torch.randn(1, 3, model.config.d_model)).name == "flash"
    encoded, positions = batch(folders[family])
    with torch.no_grad():
        theirs = reference_model(folders[family])(**encoded, position_ids=positions, output_attentions=True,
                                                  output_hidden_states=True)
        ours = model(TEXTS)  # the kernel: no weights asked for
        weighted = model(TEXTS, output_attentions=True, output_hidden_states=True)  # the reference path
    real = encoded["attention_mask"].bool()
    torch.testing.assert_close(ours.logits[real], theirs.logits[real], atol=1e-4, rtol=1e-4)
    logits, hidden, weights = differences(weighted, theirs, encoded["attention_mask"])
    assert logits < 1e-4 and hidden < 1e-4 and weights < 1e-5


def test_gemma3_turns_each_kind_of_layer_with_its_own_base_once_per_call(folders, monkeypatch):
    import selfattn as sa
    import selfattn.models.decoder as decoder

    model = sa.load_pretrained(folders["gemma3_text"])
    assert [layer.attention.config.rope_base for layer in model.layers] == [20.0, 1_000_000.0]
    assert [layer.attention.config.sliding_window for layer in model.layers] == [5, None]
    bases = []
    original = decoder.rope_rotation

    def counted(positions, d_head, base, *rest):
        bases.append(base)
        return original(positions, d_head, base, *rest)

    monkeypatch.setattr(decoder, "rope_rotation", counted)
    with torch.no_grad():
        model(TEXTS)
    assert sorted(bases) == [20.0, 1_000_000.0]


GEMMA_CHANGES = {  # each Gemma difference left out: the tiny checkpoint must notice
    "one RoPE base": dict(rope_bases=()),
    "bases swapped": dict(rope_bases=(1_000_000.0, 20.0)),
    "scale 1/sqrt(head_dim)": dict(scale=None),
    "gain w": dict(norm_gain="w"),
    "embeddings unscaled": dict(scale_embeddings=False),
    "no q/k norms": dict(qk_norm=False),
    "no window": dict(sliding_windows=()),
}


@pytest.mark.parametrize("change", GEMMA_CHANGES)
def test_each_gemma_difference_shows_in_the_logits(change, folders):
    import selfattn as sa
    from selfattn.models.decoder import DecoderModel

    model = sa.load_pretrained(folders["gemma3_text"])
    changed = DecoderModel(dataclasses.replace(model.config, **GEMMA_CHANGES[change]), model.tokenizer)
    state = {k: v for k, v in model.state_dict().items() if k in changed.state_dict()}
    missing, _ = changed.load_state_dict(state, strict=False)
    assert not missing
    with torch.no_grad():
        moved = float((changed(TEXTS).logits - model(TEXTS).logits).abs().max())
    assert moved > 1e-2, f"leaving out {change} moved the logits by only {moved:.2g}"


@pytest.mark.parametrize(("family", "field", "value"), [
    ("gemma3_text", "final_logit_softcapping", 30.0),
    ("gemma3_text", "attn_logit_softcapping", 50.0),
    ("gemma3_text", "rope_parameters", {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}),
    ("qwen3", "num_experts", 8),
    ("qwen3", "rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                  "original_max_position_embeddings": 32}),
])
def test_a_folder_asking_for_what_we_do_not_compute_is_refused_in_one_line(family, field, value, folders, tmp_path):
    import selfattn as sa

    for item in folders[family].iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, **{field: value})))
    with pytest.raises(ModelError, match=f"'{field}'") as refused:
        sa.load_pretrained(tmp_path)
    assert "\n" not in str(refused.value)


def test_the_walkthrough_says_what_gemma_and_qwen3_compute(run_cli, folders):
    status, out, err = run_cli("explain", "--model", str(folders["gemma3_text"]), "The cat sat on the mat", "--layer", "1")
    assert status == 0, err
    text = " ".join(out.split())
    assert "multiplied by this checkpoint's own scale, 0.2887 = 1/√12, in place of the usual 1/√16" in text
    assert "s = q · k × 0.2887" in text and "/ √16" not in text
    assert "q_norm and k_norm, times 1 + g" in text and "GeGLU" in text
    assert "normalised once more by RMSNorm and added" in text
    status, data, err = run_cli("explain", "--model", str(folders["gemma3_text"]), "The cat sat on the mat", "--layer", "1",
                                "--format", "json")
    record = json.loads(data)
    assert record["scale"] == pytest.approx(12 ** -0.5)
    status, out, err = run_cli("explain", "--model", str(folders["qwen3"]), "The cat sat on the mat")
    text = " ".join(out.split())
    assert "q_norm and k_norm, times a learned gain g" in text and "divided by √24" in text
