"""Transformer blocks and stacks against torch.nn.TransformerEncoderLayer / TransformerEncoder
with copied weights, KV-cached decoding against the full causal pass, and the paper formulas
for the feed-forward network, the sinusoidal code and the attention weights."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from selfattn.attention.config import TransformerConfig
from selfattn.attention.kv_cache import KVCache
from selfattn.attention.transformer import FeedForward, Transformer, TransformerBlock, TransformerOutput
from selfattn.errors import ConfigError, ShapeError

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=1e-12)}
CACHE_TOL = dict(atol=1e-10, rtol=0.0)
MASKS = ["none", "causal", "padding", "causal+padding"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tensors are tiny: waking a thread pool per LayerNorm costs more than the math."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- helpers


def torch_layer(config: TransformerConfig, dtype=torch.float64) -> nn.TransformerEncoderLayer:
    """torch's encoder layer for the same config, with every weight nudged off its init."""
    layer = nn.TransformerEncoderLayer(
        config.d_model, config.n_heads, dim_feedforward=config.ff_size, dropout=0.0,
        activation=config.activation, layer_norm_eps=config.norm_eps, batch_first=True,
        norm_first=config.norm_first, bias=config.bias, dtype=dtype,
    )
    _perturb(layer)
    return layer.eval()


def _perturb(module: nn.Module) -> None:
    """LayerNorm starts at (1, 0) and attention biases at 0; move them so a swapped copy would show."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))


def _copy(ours: nn.Module, theirs: nn.Module) -> None:
    assert ours.weight.shape == theirs.weight.shape
    ours.weight.copy_(theirs.weight)
    assert (ours.bias is None) == (theirs.bias is None)
    if ours.bias is not None:
        ours.bias.copy_(theirs.bias)


def copy_torch_layer(block: TransformerBlock, layer: nn.TransformerEncoderLayer) -> None:
    """torch packs W_q, W_k, W_v row-wise into in_proj_weight (3d, d); the rest copies by name."""
    attn, mha = block.attention, layer.self_attn
    projections = (attn.w_q, attn.w_k, attn.w_v)
    with torch.no_grad():
        for ours, theirs in zip(projections, mha.in_proj_weight.chunk(3)):
            ours.weight.copy_(theirs)
        assert (mha.in_proj_bias is None) == (attn.w_q.bias is None)
        if mha.in_proj_bias is not None:
            for ours, theirs in zip(projections, mha.in_proj_bias.chunk(3)):
                ours.bias.copy_(theirs)
        _copy(attn.w_o, mha.out_proj)
        _copy(block.feed_forward.linear1, layer.linear1)
        _copy(block.feed_forward.linear2, layer.linear2)
        _copy(block.norm1, layer.norm1)
        _copy(block.norm2, layer.norm2)


def masks_for(kind: str, batch: int, n: int, dtype):
    """The same mask for both sides: (ours kwargs, torch kwargs, torch src_mask).

    torch marks padded keys True; ours marks the keys that may be seen True.
    """
    lengths = torch.tensor([n, max(1, n - 3), 1][:batch])
    pad = torch.arange(n)[None, :] >= lengths[:, None]  # (batch, n): True = padding
    causal, padded = "causal" in kind, "padding" in kind
    ours = dict(attn_mask=(~pad)[:, None, None, :] if padded else None, is_causal=causal)
    src_mask = nn.Transformer.generate_square_subsequent_mask(n, dtype=dtype) if causal else None
    key_padding = None
    if padded:  # a float src_mask wants a float padding mask: torch deprecates mixing the two
        key_padding = torch.zeros(pad.shape, dtype=dtype).masked_fill(pad, float("-inf")) if causal else pad
    return ours, dict(src_key_padding_mask=key_padding, is_causal=causal), src_mask


def assert_outputs_and_grads_match(ours_fn, theirs_fn, x: torch.Tensor, tol: dict) -> None:
    """Same output, and the same gradient w.r.t. the input for one random upstream gradient."""
    x_ours, x_theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out_ours, out_theirs = ours_fn(x_ours), theirs_fn(x_theirs)
    torch.testing.assert_close(out_ours, out_theirs, **tol)
    upstream = torch.randn_like(out_ours)
    out_ours.backward(upstream)
    out_theirs.backward(upstream)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, **tol)


def make_model(dtype=torch.float64, **kwargs) -> Transformer:
    model = Transformer(TransformerConfig(**kwargs)).to(dtype).eval()
    _perturb(model)
    return model


def assert_rows_are_distributions(weights: torch.Tensor, causal: bool) -> None:
    """Each query row is a probability distribution; causal rows put nothing on later keys."""
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1], dtype=weights.dtype), atol=1e-12, rtol=0)
    if causal:
        q_len, kv_len = weights.shape[-2:]
        later = torch.ones(q_len, kv_len, dtype=torch.bool).triu(kv_len - q_len + 1)  # bottom-right aligned
        assert (weights[..., later] == 0).all()


# ----------------------------------------------------------------------------- feed-forward


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_feed_forward_is_the_paper_formula(activation):
    ff = FeedForward(6, 10, activation=activation).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    hidden = x @ ff.linear1.weight.T + ff.linear1.bias  # (2, 5, 10)
    if activation == "gelu":  # exact GELU: x Phi(x), Phi the standard normal CDF
        hidden = 0.5 * hidden * (1 + torch.erf(hidden / math.sqrt(2)))
    else:
        hidden = hidden.clamp(min=0)
    expected = hidden @ ff.linear2.weight.T + ff.linear2.bias  # (2, 5, 6)
    torch.testing.assert_close(ff(x), expected, atol=1e-13, rtol=0)


# ----------------------------------------------------------------------------- one block vs torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation,bias", [("gelu", True), ("relu", True), ("gelu", False)])
def test_block_matches_torch_encoder_layer(dtype, mask, norm_first, activation, bias):
    config = TransformerConfig(12, 4, d_ff=20, norm_first=norm_first, activation=activation, bias=bias)
    layer = torch_layer(config, dtype)
    block = TransformerBlock(config).to(dtype).eval()
    copy_torch_layer(block, layer)
    x = torch.randn(3, 7, 12, dtype=dtype)
    ours, theirs, src_mask = masks_for(mask, 3, 7, dtype)
    assert_outputs_and_grads_match(
        lambda x: block(x, **ours), lambda x: layer(x, src_mask, **theirs), x, TOL[dtype]
    )
    # The same weights get the same gradients (torch's packed in_proj against our three).
    w_q, w_k, w_v = (getattr(block.attention, name).weight.grad for name in ("w_q", "w_k", "w_v"))
    torch.testing.assert_close(torch.cat([w_q, w_k, w_v]), layer.self_attn.in_proj_weight.grad, **TOL[dtype])
    torch.testing.assert_close(block.feed_forward.linear1.weight.grad, layer.linear1.weight.grad, **TOL[dtype])
    torch.testing.assert_close(block.norm1.weight.grad, layer.norm1.weight.grad, **TOL[dtype])


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("norm_first", [True, False])
def test_block_matches_torch_fast_path_without_grad(mask, norm_first):
    """Under no_grad in eval mode torch may take its fused path; the math must still agree."""
    config = TransformerConfig(8, 2, d_ff=16, norm_first=norm_first)
    layer = torch_layer(config, torch.float32)
    block = TransformerBlock(config).eval()
    copy_torch_layer(block, layer)
    x = torch.randn(3, 6, 8)
    ours, theirs, src_mask = masks_for(mask, 3, 6, torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(block(x, **ours), layer(x, src_mask, **theirs), **TOL[torch.float32])


def test_block_is_causal_defaults_to_the_config():
    block = TransformerBlock(TransformerConfig(8, 2, causal=True)).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(block(x), block(x, is_causal=True), atol=0, rtol=0)
    assert not torch.allclose(block(x), block(x, is_causal=False))


def test_block_weights_are_the_attention_distributions():
    block = TransformerBlock(TransformerConfig(8, 2)).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    out, weights = block(x, is_causal=True, need_weights=True)
    assert weights.shape == (2, 2, 5, 5)
    assert_rows_are_distributions(weights, causal=True)
    out_unbatched, weights_unbatched = block(x[1], is_causal=True, need_weights=True)
    torch.testing.assert_close(out_unbatched, out[1], atol=1e-14, rtol=0)
    torch.testing.assert_close(weights_unbatched, weights[1], atol=1e-14, rtol=0)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_block_gradcheck(norm_first, causal):
    config = TransformerConfig(4, 2, d_ff=8, norm_first=norm_first, causal=causal)
    block = TransformerBlock(config).double().eval()
    _perturb(block)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: block(x), (x,), eps=1e-6, atol=1e-5)


# ----------------------------------------------------------------------------- the stack vs torch


def torch_encoder(model: Transformer, dtype) -> nn.TransformerEncoder:
    """torch.nn.TransformerEncoder with our stack's weights (and final norm for pre-LN)."""
    config = model.config
    final = None
    if config.norm_first:
        final = nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias, dtype=dtype)
        with torch.no_grad():
            _copy(model.norm, final)
    encoder = nn.TransformerEncoder(
        torch_layer(config, dtype), config.n_layers, norm=final, enable_nested_tensor=False
    )
    for block, layer in zip(model.layers, encoder.layers):
        copy_torch_layer(block, layer)
    return encoder.eval()


@pytest.mark.parametrize("n_layers", [2, 3])
@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("mask", ["causal", "padding", "causal+padding"])
def test_stack_matches_torch_encoder(n_layers, norm_first, mask):
    dtype = torch.float64
    model = make_model(d_model=12, n_heads=4, n_layers=n_layers, d_ff=24, norm_first=norm_first)
    encoder = torch_encoder(model, dtype)
    assert (model.norm is None) == (not norm_first)
    x = torch.randn(3, 7, 12, dtype=dtype)
    ours, theirs, src_mask = masks_for(mask, 3, 7, dtype)
    assert_outputs_and_grads_match(
        lambda x: model(x, **ours).last_hidden_state, lambda x: encoder(x, src_mask, **theirs), x, TOL[dtype]
    )


@settings(max_examples=20, deadline=None)
@given(
    batch=st.integers(1, 3),
    n=st.integers(1, 6),
    n_layers=st.integers(1, 3),
    norm_first=st.booleans(),
    activation=st.sampled_from(["gelu", "relu"]),
    data=st.data(),
)
def test_stack_matches_torch_encoder_with_any_padding(batch, n, n_layers, norm_first, activation, data):
    lengths = torch.tensor(data.draw(st.lists(st.integers(1, n), min_size=batch, max_size=batch)))
    pad = torch.arange(n)[None, :] >= lengths[:, None]  # (batch, n): True = padding
    model = make_model(d_model=6, n_heads=2, n_layers=n_layers, d_ff=10, norm_first=norm_first, activation=activation)
    encoder = torch_encoder(model, torch.float64)
    x = torch.randn(batch, n, 6, dtype=torch.float64)
    with torch.no_grad():
        ours = model(x, attn_mask=(~pad)[:, None, None, :]).last_hidden_state
        theirs = encoder(x, src_key_padding_mask=pad)
    torch.testing.assert_close(ours, theirs, **TOL[torch.float64])


# ----------------------------------------------------------------------------- KV cache through the stack

CACHED = [
    dict(positional="none", norm_first=True),
    dict(positional="sinusoidal", norm_first=False),
    dict(positional="learned", norm_first=True),
    dict(positional="rope", norm_first=True),
    dict(positional="alibi", norm_first=False),
    dict(positional="rope", n_kv_heads=2, norm_first=True),  # grouped-query
    dict(positional="alibi", n_kv_heads=1, norm_first=True),  # multi-query
]


@pytest.mark.parametrize("chunks", [[1] * 9, [2, 3, 1, 3], [4, 5]], ids=["token", "chunks", "prefill"])
@pytest.mark.parametrize("options", CACHED, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_cached_decoding_equals_the_full_causal_pass(options, chunks):
    model = make_model(d_model=16, n_heads=4, n_layers=3, causal=True, **options)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    full = model(x, output_attentions=True, output_hidden_states=True)
    caches = model.new_caches()
    start = 0
    for size in chunks:
        step = model(x[:, start : start + size], caches=caches, output_attentions=True, output_hidden_states=True)
        rows, seen = slice(start, start + size), start + size
        torch.testing.assert_close(step.last_hidden_state, full.last_hidden_state[:, rows], **CACHE_TOL)
        for h_step, h_full in zip(step.hidden_states, full.hidden_states, strict=True):
            torch.testing.assert_close(h_step, h_full[:, rows], **CACHE_TOL)
        for a_step, a_full in zip(step.attentions, full.attentions, strict=True):
            assert a_step.shape == (2, 4, size, seen)
            torch.testing.assert_close(a_step, a_full[:, :, rows, :seen], **CACHE_TOL)
            assert (a_full[:, :, rows, seen:] == 0).all()  # the full pass hid the future
        start = seen
    kv_heads = options.get("n_kv_heads") or 4
    assert [tuple(cache.key.shape) for cache in caches] == [(2, kv_heads, 9, 4)] * 3


def test_cached_decoding_of_an_unbatched_sequence():
    model = make_model(d_model=8, n_heads=2, n_layers=2, causal=True, positional="learned")
    x = torch.randn(5, 8, dtype=torch.float64)
    full = model(x).last_hidden_state
    caches = model.new_caches()
    steps = [model(x[t : t + 1], caches=caches, output_attentions=True) for t in range(5)]
    torch.testing.assert_close(torch.cat([s.last_hidden_state for s in steps]), full, **CACHE_TOL)
    assert steps[-1].attentions[0].shape == (2, 1, 5)


# ----------------------------------------------------------------------------- outputs: shapes and values


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_hidden_states_and_attentions_have_documented_shapes_and_values(norm_first, causal):
    model = make_model(d_model=8, n_heads=2, n_layers=3, norm_first=norm_first, causal=causal, positional="sinusoidal")
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    out = model(x, output_attentions=True, output_hidden_states=True)
    assert isinstance(out, TransformerOutput)
    assert len(out.hidden_states) == 4 and len(out.attentions) == 3
    assert all(h.shape == (2, 5, 8) for h in out.hidden_states)
    assert all(a.shape == (2, 2, 5, 5) for a in out.attentions)
    for weights in out.attentions:
        assert_rows_are_distributions(weights, causal)
    for i, layer in enumerate(model.layers):
        torch.testing.assert_close(out.hidden_states[i + 1], layer(out.hidden_states[i]), atol=1e-14, rtol=0)
    final = model.norm(out.hidden_states[-1]) if norm_first else out.hidden_states[-1]
    torch.testing.assert_close(out.last_hidden_state, final, atol=0, rtol=0)
    if not norm_first:  # post-LN ends in LN2: each position has the norm's mean and spread
        norm = model.layers[-1].norm2
        standardised = (out.last_hidden_state - norm.bias) / norm.weight
        torch.testing.assert_close(standardised.mean(-1), torch.zeros(2, 5, dtype=torch.float64), atol=1e-10, rtol=0)
    plain = model(x)
    assert plain.hidden_states is None and plain.attentions is None
    torch.testing.assert_close(plain.last_hidden_state, out.last_hidden_state, atol=0, rtol=0)


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_first_layer_attention_is_softmax_of_scaled_scores(n_kv_heads):
    """attentions[0] = softmax(Q K^T / sqrt(d_head) + causal mask), Q and K from LN1(x) by hand."""
    model = make_model(d_model=8, n_heads=4, n_kv_heads=n_kv_heads, n_layers=1, causal=True)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    attn = model.layers[0].attention
    h = model.layers[0].norm1(x)  # pre-LN: attention reads the normalised input
    kv_heads = n_kv_heads or 4
    q = (h @ attn.w_q.weight.T + attn.w_q.bias).view(2, 5, 4, 2).transpose(1, 2)  # (2, 4, 5, 2)
    k = (h @ attn.w_k.weight.T + attn.w_k.bias).view(2, 5, kv_heads, 2).transpose(1, 2)  # (2, Hkv, 5, 2)
    k = k.repeat_interleave(4 // kv_heads, dim=1)  # query head h reads key head h // group
    scores = q @ k.transpose(-2, -1) / math.sqrt(2)  # (2, 4, 5, 5)
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.softmax(scores, dim=-1)
    (weights,) = model(x, output_attentions=True).attentions
    torch.testing.assert_close(weights, expected, atol=1e-14, rtol=0)


def test_unbatched_input_gives_unbatched_outputs():
    model = make_model(d_model=8, n_heads=2, n_layers=2, positional="rope")
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    batched = model(x, output_attentions=True, output_hidden_states=True)
    single = model(x[0], output_attentions=True, output_hidden_states=True)
    torch.testing.assert_close(single.last_hidden_state, batched.last_hidden_state[0], atol=1e-14, rtol=0)
    for a, b in zip(single.hidden_states + single.attentions, batched.hidden_states + batched.attentions, strict=True):
        torch.testing.assert_close(a, b[0], atol=1e-14, rtol=0)
    assert single.attentions[0].shape == (2, 5, 5)


# ----------------------------------------------------------------------------- positions added at the input


def test_sinusoidal_positions_are_the_paper_formula():
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...), continued across a cache."""
    d = 6
    model = make_model(d_model=d, n_heads=2, causal=True, positional="sinusoidal")
    caches = model.new_caches()
    first = model(torch.zeros(1, 3, d, dtype=torch.float64), caches=caches, output_hidden_states=True)
    second = model(torch.zeros(1, 2, d, dtype=torch.float64), caches=caches, output_hidden_states=True)
    codes = torch.cat([first.hidden_states[0][0], second.hidden_states[0][0]])  # (5, d): positions 0..4
    for pos in range(5):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert codes[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-15)
            assert codes[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-15)


def test_learned_positions_add_table_rows_from_the_cache_offset():
    model = make_model(d_model=8, n_heads=2, causal=True, positional="learned", max_positions=6)
    table = model.position_embedding.weight
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    caches = model.new_caches()
    first = model(x[:, :3], caches=caches, output_hidden_states=True)
    second = model(x[:, 3:], caches=caches, output_hidden_states=True)
    torch.testing.assert_close(first.hidden_states[0], x[:, :3] + table[:3], atol=0, rtol=0)
    torch.testing.assert_close(second.hidden_states[0], x[:, 3:] + table[3:4], atol=0, rtol=0)
    with pytest.raises(ShapeError, match="max_positions is 6"):
        model(torch.randn(1, 3, 8, dtype=torch.float64), caches=caches)  # positions 4..6


# ----------------------------------------------------------------------------- dropout


def test_dropout_is_off_in_eval_and_on_in_training():
    with_dropout = make_model(dtype=torch.float32, d_model=8, n_heads=2, n_layers=2, dropout=0.3)
    without = Transformer(TransformerConfig(8, 2, n_layers=2, dropout=0.0)).eval()
    without.load_state_dict(with_dropout.state_dict())
    x = torch.randn(2, 5, 8)
    eval_out = with_dropout(x).last_hidden_state
    torch.testing.assert_close(eval_out, without(x).last_hidden_state, atol=0, rtol=0)
    torch.testing.assert_close(with_dropout(x).last_hidden_state, eval_out, atol=0, rtol=0)

    with_dropout.train()
    torch.manual_seed(1)
    train_a = with_dropout(x).last_hidden_state
    torch.manual_seed(2)
    train_b = with_dropout(x).last_hidden_state
    assert (train_a - eval_out).abs().max() > 1e-3
    assert (train_a - train_b).abs().max() > 1e-3
    torch.manual_seed(1)
    torch.testing.assert_close(with_dropout(x).last_hidden_state, train_a, atol=0, rtol=0)


def _set_dropout(block: TransformerBlock, site: str, p: float) -> None:
    if site == "attention":  # attention reads its rate from its (frozen) config
        block.attention.config = dataclasses.replace(block.attention.config, dropout=p)
    else:
        block.get_submodule(site).p = p


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("site", ["attention", "dropout1", "feed_forward.dropout", "dropout2"])
def test_each_dropout_site_acts_in_training(site, norm_first):
    """Only one of the four dropouts left on: it alone must change the training output."""
    block = TransformerBlock(TransformerConfig(8, 2, dropout=0.5, norm_first=norm_first))
    for other in ("attention", "dropout1", "feed_forward.dropout", "dropout2"):
        _set_dropout(block, other, 0.5 if other == site else 0.0)
    x = torch.randn(2, 5, 8)
    eval_out = block.eval()(x)
    assert (block.train()(x) - eval_out).abs().max() > 1e-3
    _set_dropout(block, site, 0.0)
    torch.testing.assert_close(block(x), eval_out, atol=0, rtol=0)


# ----------------------------------------------------------------------------- refusals


def assert_refused(error, match, fn, *args, **kwargs):
    with pytest.raises(error, match=match):
        fn(*args, **kwargs)


def test_wrong_input_width_names_the_shape():
    model = make_model(d_model=8, n_heads=2)
    assert_refused(ShapeError, r"\(batch, seq, 8\).*\(2, 5, 7\)", model, torch.randn(2, 5, 7))
    assert_refused(ShapeError, r"got \(8,\)", model, torch.randn(8))
    assert_refused(ShapeError, r"got \(1, 2, 5, 8\)", model, torch.randn(1, 2, 5, 8))
    assert_refused(ShapeError, r"\(2, 5, 7\)", model.layers[0], torch.randn(2, 5, 7))


def test_caches_must_be_one_per_layer():
    model = make_model(d_model=8, n_heads=2, n_layers=3, causal=True)
    x = torch.randn(1, 2, 8, dtype=torch.float64)
    assert_refused(ShapeError, r"one KVCache per layer \(3\), got 2", model, x, caches=[KVCache(), KVCache()])
    assert_refused(ShapeError, r"got a KVCache", model, x, caches=KVCache())
    caches = model.new_caches()
    assert len(caches) == 3 and all(cache.length == 0 for cache in caches)
    model(x, caches=caches)
    caches[0].reset()
    assert_refused(ShapeError, r"different lengths \[0, 2, 2\]", model, x, caches=caches)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d_model=8, n_heads=2, activation="swish"), "unknown activation 'swish'"),
        (dict(d_model=10, n_heads=3), r"d_model \(10\) must be divisible by n_heads \(3\)"),
        (dict(d_model=8, n_heads=4, n_kv_heads=3), r"n_heads \(4\) must be divisible by n_kv_heads \(3\)"),
        (dict(d_model=8, n_heads=2, n_layers=0), "n_layers must be a positive integer, got 0"),
        (dict(d_model=8, n_heads=2, n_layers=2.0), "n_layers must be a positive integer"),
        (dict(d_model=8, n_heads=2, d_ff=0), "d_ff must be a positive integer"),
        (dict(d_model=8, n_heads=2, dropout=1.0), r"dropout must be a number in \[0, 1\)"),
        (dict(d_model=8, n_heads=2, positional="relative"), "unknown positional encoding"),
    ],
)
def test_invalid_transformer_configs_cannot_be_built(kwargs, match):
    assert_refused(ConfigError, match, TransformerConfig, **kwargs)


def test_feed_forward_validates_its_sizes():
    assert_refused(ConfigError, "unknown activation 'tanh'", FeedForward, 8, 16, activation="tanh")
    assert_refused(ConfigError, "d_ff must be a positive integer", FeedForward, 8, 0)
