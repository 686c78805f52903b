"""MultiHeadAttention and SelfAttention against computations by hand with torch's SDPA and nn.MultiheadAttention."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn.attention.config import AttentionConfig
from selfattn.attention.kv_cache import KVCache
from selfattn.attention.modules import MultiHeadAttention
from selfattn.attention.self_attention import SelfAttention
from selfattn.errors import ConfigError, ShapeError
from selfattn.masks import padding_mask

TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.float64: {"atol": 1e-12, "rtol": 1e-10}}
DTYPES = [torch.float32, torch.float64]


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def make_module(seed=0, dtype=torch.float64, **kwargs):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return MultiHeadAttention(**kwargs).to(dtype)


def project(x, linear):
    """x W^T + b, by hand."""
    return x @ linear.weight.T + (0.0 if linear.bias is None else linear.bias)


def bottom_right_causal(q_len, kv_len):
    return torch.ones(q_len, kv_len, dtype=torch.bool).tril(diagonal=kv_len - q_len)


def reference_heads(module, query, key, value):
    """Q, K, V projected by hand and split into heads: (batch, heads, seq, head_dim)."""
    c = module.config
    batch, q_len, kv_len = query.shape[0], query.shape[1], key.shape[1]
    q = project(query, module.w_q).reshape(batch, q_len, c.n_heads, -1).transpose(1, 2)
    k = project(key, module.w_k).reshape(batch, kv_len, c.n_kv_heads, -1).transpose(1, 2)
    v = project(value, module.w_v).reshape(batch, kv_len, c.n_kv_heads, -1).transpose(1, 2)
    return q, k, v


def reference_mha(module, query, key=None, value=None, attn_mask=None, is_causal=False):
    """Projections by hand, torch's SDPA per head (enable_gqa for fewer kv heads), concat, output projection."""
    key = query if key is None else key
    value = key if value is None else value
    q, k, v = reference_heads(module, query, key, value)
    mask = attn_mask
    if is_causal:
        causal = bottom_right_causal(q.shape[-2], k.shape[-2])
        mask = causal if mask is None else mask & causal
    dead = None if mask is None else ~mask.any(-1, keepdim=True)  # (..., q_len, 1): rows that see no key
    if dead is not None:
        mask = mask | dead  # torch may give NaN there; open them up and zero them below
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
    if dead is not None:
        heads = heads.masked_fill(dead, 0.0)  # (batch, H, q_len, head_dim)
    concat = heads.transpose(1, 2).reshape(query.shape[0], query.shape[1], -1)  # (batch, q_len, H * head_dim)
    return project(concat, module.w_o)


def reference_weights(module, query, key, attn_mask=None):
    """softmax(Q_h K_g(h)^T / sqrt(head_dim) + mask), g(h) = h // group, with torch.softmax."""
    c = module.config
    q = project(query, module.w_q).reshape(query.shape[0], query.shape[1], c.n_heads, -1).transpose(1, 2)
    k = project(key, module.w_k).reshape(key.shape[0], key.shape[1], c.n_kv_heads, -1).transpose(1, 2)
    group = q.shape[1] // k.shape[1]
    scores = torch.stack([q[:, h] @ k[:, h // group].transpose(-2, -1) for h in range(q.shape[1])], dim=1)
    scores = scores / math.sqrt(q.shape[-1])
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row that sees no key: zeros


def assert_same_outputs_and_grads(ours_fn, reference_fn, inputs, params, dtype):
    """Output and the gradients w.r.t. the inputs and every parameter agree."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    ours = ours_fn(*leaves)
    theirs = reference_fn(*leaves)
    tol = TOL[dtype]
    torch.testing.assert_close(ours, theirs, **tol)
    upstream = randn(*ours.shape, seed=42, dtype=dtype)
    wrt = [*leaves, *params]
    our_grads, their_grads = torch.autograd.grad(ours, wrt, upstream), torch.autograd.grad(theirs, wrt, upstream)
    for ours_grad, their_grad in zip(our_grads, their_grads):
        torch.testing.assert_close(ours_grad, their_grad, **tol)


# (module kwargs, batch, q_len, kv_len, cross-attention)
CASES = [
    (dict(d_model=8, n_heads=2), 1, 5, 5, False),
    (dict(d_model=12, n_heads=3, bias=False), 3, 7, 7, False),
    (dict(d_model=16, n_heads=4, n_kv_heads=2), 2, 5, 5, False),
    (dict(d_model=16, n_heads=4, n_kv_heads=1), 2, 3, 3, False),
    (dict(d_model=12, n_heads=6, n_kv_heads=3, bias=False), 1, 9, 9, False),
    (dict(d_model=10, n_heads=3, d_head=4), 2, 5, 5, False),
    (dict(d_model=8, n_heads=2), 2, 3, 7, True),
    (dict(d_model=8, n_heads=4, n_kv_heads=2, kdim=5, vdim=3), 2, 6, 4, True),
    (dict(d_model=6, n_heads=3, n_kv_heads=1, kdim=7, vdim=2, d_head=5, bias=False), 1, 5, 9, True),
]


def inputs_for(module, batch, q_len, kv_len, cross, dtype, seed=0):
    c = module.config
    query = randn(batch, q_len, c.d_model, seed=seed, dtype=dtype)
    if not cross:
        return (query,)
    key = randn(batch, kv_len, c.kdim or c.d_model, seed=seed + 1, dtype=dtype)
    value = randn(batch, kv_len, c.vdim or c.d_model, seed=seed + 2, dtype=dtype)
    return query, key, value


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
@pytest.mark.parametrize("kwargs,batch,q_len,kv_len,cross", CASES)
def test_multihead_matches_a_computation_by_hand(kwargs, batch, q_len, kv_len, cross, mask_kind, dtype):
    module = make_module(dtype=dtype, **kwargs)
    inputs = inputs_for(module, batch, q_len, kv_len, cross, dtype)
    options = {}
    if mask_kind == "causal":
        options["is_causal"] = True
    elif mask_kind == "padding":
        lengths = [max(1, kv_len - 2 * b) for b in range(batch)]
        options["attn_mask"] = padding_mask(lengths, kv_len)
    assert_same_outputs_and_grads(
        lambda *x: module(*x, **options),
        lambda *x: reference_mha(module, *x, **options),
        inputs,
        list(module.parameters()),
        dtype,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kwargs,batch,q_len,kv_len,cross", CASES)
def test_need_weights_returns_each_heads_softmax(kwargs, batch, q_len, kv_len, cross, dtype):
    module = make_module(dtype=dtype, **kwargs)
    inputs = inputs_for(module, batch, q_len, kv_len, cross, dtype)
    output, weights = module(*inputs, is_causal=True, need_weights=True)
    key = inputs[1] if cross else inputs[0]
    assert weights.shape == (batch, module.config.n_heads, q_len, kv_len if cross else q_len)
    expected = reference_weights(module, inputs[0], key, bottom_right_causal(q_len, key.shape[1]))
    tol = TOL[dtype]
    torch.testing.assert_close(weights, expected, **tol)
    torch.testing.assert_close(output, reference_mha(module, *inputs, is_causal=True), **tol)


@pytest.mark.parametrize("kwargs,batch,q_len,kv_len,cross", CASES)
def test_unbatched_input_is_batch_of_one(kwargs, batch, q_len, kv_len, cross):
    module = make_module(**kwargs)
    inputs = [x[:1] for x in inputs_for(module, batch, q_len, kv_len, cross, torch.float64)]
    unbatched, weights = module(*(x[0] for x in inputs), is_causal=True, need_weights=True)
    assert unbatched.shape == (q_len, module.config.d_model)
    torch.testing.assert_close(unbatched, reference_mha(module, *inputs, is_causal=True)[0], **TOL[torch.float64])
    _, batched_weights = module(*inputs, is_causal=True, need_weights=True)
    torch.testing.assert_close(weights, batched_weights[0], **TOL[torch.float64])  # (H, q_len, kv_len)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kdim,vdim,q_len,kv_len", [(None, None, 5, 5), (None, None, 3, 6), (5, 3, 4, 7)])
def test_matches_torch_nn_multihead_attention_with_copied_weights(kdim, vdim, q_len, kv_len, dtype):
    """torch's module with our weights; its key_padding_mask uses the opposite convention (True = ignore)."""
    ours = make_module(dtype=dtype, d_model=8, n_heads=2, kdim=kdim, vdim=vdim).eval()
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True, kdim=kdim, vdim=vdim, dtype=dtype).eval()
    with torch.no_grad():
        if kdim is None:
            theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        else:
            theirs.q_proj_weight.copy_(ours.w_q.weight)
            theirs.k_proj_weight.copy_(ours.w_k.weight)
            theirs.v_proj_weight.copy_(ours.w_v.weight)
        theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        theirs.out_proj.weight.copy_(ours.w_o.weight)
        theirs.out_proj.bias.copy_(ours.w_o.bias)
    query = randn(3, q_len, 8, dtype=dtype)
    key = randn(3, kv_len, kdim or 8, seed=1, dtype=dtype)
    value = randn(3, kv_len, vdim or 8, seed=2, dtype=dtype)
    keep = padding_mask([kv_len, kv_len - 1, 2], kv_len)  # (3, 1, 1, kv_len), True = may attend
    output, weights = ours(query, key, value, attn_mask=keep, need_weights=True)
    expected, expected_weights = theirs(
        query, key, value, key_padding_mask=~keep[:, 0, 0], need_weights=True, average_attn_weights=False
    )
    tol = TOL[dtype]
    torch.testing.assert_close(output, expected, **tol)
    torch.testing.assert_close(weights, expected_weights, **tol)


# KV cache: decoding in pieces equals one causal pass.


@pytest.mark.parametrize("chunks", [[1] * 7, [2, 2, 2, 1], [3, 3, 1], [1, 3, 2, 1], [7]])
@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, None), (4, 2), (4, 1)])
@pytest.mark.parametrize("positional", ["none", "rope", "alibi"])
def test_kv_cache_in_chunks_equals_a_full_causal_pass(positional, n_heads, n_kv_heads, chunks):
    module = make_module(d_model=16, n_heads=n_heads, n_kv_heads=n_kv_heads, positional=positional)
    x = randn(2, sum(chunks), 16)
    full = module(x, is_causal=True)
    cache, outputs, start = KVCache(), [], 0
    for size in chunks:
        outputs.append(module(x[:, start : start + size], is_causal=True, cache=cache))
        start += size
        assert cache.length == start
    torch.testing.assert_close(torch.cat(outputs, dim=1), full, atol=1e-12, rtol=1e-10)


def test_kv_cache_matches_the_reference_and_resets():
    module = make_module(d_model=8, n_heads=2, n_kv_heads=1)
    x = randn(1, 5, 8)
    cache = KVCache()
    last = [module(x[:, i : i + 1], is_causal=True, cache=cache) for i in range(5)][-1]
    torch.testing.assert_close(last, reference_mha(module, x, is_causal=True)[:, -1:], **TOL[torch.float64])
    torch.testing.assert_close(cache.key, reference_heads(module, x, x, x)[1], **TOL[torch.float64])
    cache.reset()
    assert cache.length == 0 and cache.key is None and cache.value is None


def test_kv_cache_refuses_keys_of_another_batch():
    module = make_module(d_model=8, n_heads=2)
    cache = KVCache()
    module(randn(2, 3, 8), is_causal=True, cache=cache)
    with pytest.raises(ShapeError, match=r"new keys \(3, 2, 1, 4\) do not fit the cached keys \(2, 2, 3, 4\)"):
        module(randn(3, 1, 8), is_causal=True, cache=cache)


# Dropout.


def float32_error_and_torchs(module32, outputs, x):
    """max |ours - ref64| and max |torch32 - ref64| (ref64: the hand-made reference in float64).

    Two paths of the module (with and without weights, eval or training at p = 0) may sum
    in different orders, and which order rounds lower depends on the CPU; so each is held
    to PyTorch's own float32 error on the same input rather than to the other path's bits.
    """
    module64 = make_module(d_model=module32.config.d_model, n_heads=module32.config.n_heads)
    module64.load_state_dict({k: v.double() for k, v in module32.state_dict().items()})
    with torch.no_grad():
        ref64 = reference_mha(module64, x.double())
        torch32 = reference_mha(module32, x)
    theirs = float((torch32.double() - ref64).abs().max())
    return [float((out.detach().double() - ref64).abs().max()) for out in outputs], theirs


def test_dropout_is_off_in_eval_and_on_in_training():
    p = 0.5
    module = make_module(d_model=16, n_heads=4, dropout=p, dtype=torch.float32)
    plain = make_module(d_model=16, n_heads=4, dropout=0.0, dtype=torch.float32)
    plain.load_state_dict(module.state_dict())
    x = randn(4, 16, 16, dtype=torch.float32)
    module.eval()
    evaluated, eval_weights = module(x, need_weights=True)
    plain.train()
    trained_plain = plain(x)  # dropout 0 in training changes nothing
    plain.eval()
    errors, torchs = float32_error_and_torchs(module, [module(x), evaluated, plain(x), trained_plain], x)
    for error in errors:  # every path is the dropout-free attention, as exact as torch's own float32
        assert error <= 2 * torchs + 1e-7, (errors, torchs)
    module.train()
    with torch.random.fork_rng():
        torch.manual_seed(3)
        trained, weights = module(x, need_weights=True)
    assert not torch.allclose(trained, evaluated, atol=1e-3)
    dropped = weights == 0
    fraction = dropped.double().mean().item()
    assert abs(fraction - p) <= 4 * math.sqrt(p * (1 - p) / weights.numel()), fraction
    torch.testing.assert_close(weights[~dropped], eval_weights[~dropped] / (1 - p), atol=0, rtol=1e-6)


# gradcheck.


@pytest.mark.parametrize(
    "kwargs", [dict(n_heads=2), dict(n_heads=2, n_kv_heads=1, positional="rope"), dict(n_heads=2, positional="alibi")]
)
def test_gradcheck_multihead(kwargs):
    module = make_module(d_model=4, **kwargs)
    x = randn(2, 3, 4).requires_grad_()
    memory = randn(2, 5, 4, seed=1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: module(x, is_causal=True), (x,))
    assert torch.autograd.gradcheck(lambda x, m: module(x, m), (x, memory))


# SelfAttention (one head).


def reference_self_attention(module, x, is_causal=False):
    q, k, v = project(x, module.w_q), project(x, module.w_k), project(x, module.w_v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        n = x.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape,d_k,d_v", [((1, 5), 3, None), ((6, 5), 3, 4), ((2, 7, 5), 2, 6), ((3, 1, 5), 4, 1)])
def test_self_attention_matches_the_formula_by_hand(shape, d_k, d_v, bias, is_causal, dtype):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        module = SelfAttention(shape[-1], d_k, d_v, bias=bias).to(dtype)
    x = randn(*shape, dtype=dtype)
    assert_same_outputs_and_grads(
        lambda x: module(x, is_causal=is_causal),
        lambda x: reference_self_attention(module, x, is_causal)[0],
        (x,),
        list(module.parameters()),
        dtype,
    )
    _, weights = module(x, is_causal=is_causal, need_weights=True)
    torch.testing.assert_close(weights, reference_self_attention(module, x, is_causal)[1], **TOL[dtype])


@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 3),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 3),
    d_head=st.integers(1, 4),
    q_len=st.integers(1, 6),
    kv_len=st.integers(1, 6),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_multihead_cross_attention_property(batch, kv_heads, group, d_head, q_len, kv_len, bias, seed):
    n_heads = kv_heads * group
    module = make_module(
        seed=seed, d_model=5, n_heads=n_heads, n_kv_heads=kv_heads, d_head=d_head, kdim=3, bias=bias
    )
    query = randn(batch, q_len, 5, seed=seed)
    key, value = randn(batch, kv_len, 3, seed=seed + 1), randn(batch, kv_len, 5, seed=seed + 2)
    params = [module.w_q.weight, module.w_k.weight]
    inputs = (query, key, value)
    assert_same_outputs_and_grads(module, lambda *x: reference_mha(module, *x), inputs, params, torch.float64)


# Configuration.


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d_model=10, n_heads=3), r"d_model \(10\) must be divisible by n_heads \(3\)"),
        (dict(d_model=12, n_heads=4, n_kv_heads=3), r"n_heads \(4\) must be divisible by n_kv_heads \(3\)"),
        (dict(d_model=8, n_heads=2, n_kv_heads=4), r"n_heads \(2\) must be divisible by n_kv_heads \(4\)"),
        (dict(d_model=8, positional="rotary"), r"unknown positional encoding 'rotary'"),
        (dict(d_model=6, n_heads=2, positional="rope"), r"d_head must be even, got 3"),
        (dict(d_model=8, d_head=5, positional="rope"), r"d_head must be even, got 5"),
        (dict(d_model=8, dropout=1.0), r"dropout must be a number in \[0, 1\), got 1\.0"),
        (dict(d_model=8, dropout=-0.1), r"got -0\.1"),
        (dict(d_model=8, dropout=True), r"dropout .* got True"),
        (dict(d_model=8.0), r"d_model must be a positive integer, got 8\.0"),
        (dict(d_model=0), r"d_model must be a positive integer, got 0"),
        (dict(d_model=8, n_heads="2"), r"n_heads must be a positive integer, got '2'"),
        (dict(d_model=8, n_heads=2, n_kv_heads=0), r"n_kv_heads must be a positive integer, got 0"),
        (dict(d_model=8, d_head=-1), r"d_head must be a positive integer, got -1"),
        (dict(d_model=8, kdim=2.5), r"kdim must be a positive integer, got 2\.5"),
        (dict(d_model=8, bias="yes"), r"bias must be True or False, got 'yes'"),
        (dict(d_model=8, rope_base=1.0), r"rope_base must be a number > 1, got 1\.0"),
        (dict(d_model=8, attn_impl="fused"), r"unknown attention implementation 'fused'"),
    ],
)
def test_invalid_configuration_raises_config_error(kwargs, match):
    assert issubclass(ConfigError, ValueError)
    with pytest.raises(ConfigError, match=match):
        AttentionConfig(**kwargs)
    with pytest.raises(ConfigError, match=match):
        MultiHeadAttention(**kwargs)


def test_attention_config_is_frozen_and_module_uses_it():
    config = AttentionConfig(d_model=12, n_heads=4, n_kv_heads=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.n_heads = 3
    assert (config.n_kv_heads, config.d_head, config.group_size) == (2, 3, 2)
    module = MultiHeadAttention.from_config(config)
    assert module.config is config
    assert module.w_k.weight.shape == (2 * 3, 12) and module.w_q.weight.shape == (4 * 3, 12)


@pytest.mark.parametrize(
    "args,match", [((0, 3), r"d_model must be a positive integer, got 0"), ((4, 0), r"d_head .* got 0")]
)
def test_self_attention_invalid_sizes(args, match):
    with pytest.raises(ConfigError, match=match):
        SelfAttention(*args)


# Bad inputs to forward.


@pytest.mark.parametrize(
    "args,match",
    [
        ((randn(2, 5, 7),), r"query must be \(batch, seq, 8\) or \(seq, 8\), got \(2, 5, 7\)"),
        ((randn(1, 2, 5, 8),), r"query must be .* got \(1, 2, 5, 8\)"),
        ((randn(2, 5, 8), randn(3, 5, 8)), r"batch size.*query \(2, 5, 8\), key \(3, 5, 8\), value \(3, 5, 8\)"),
        ((randn(2, 5, 8), randn(2, 4, 8), randn(2, 6, 8)), r"key \(2, 4, 8\), value \(2, 6, 8\)"),
        ((randn(2, 5, 8), randn(2, 4, 6)), r"key must be \(batch, seq, 8\) or \(seq, 8\), got \(2, 4, 6\)"),
        ((randn(2, 5, 8), randn(2, 4, 8), randn(2, 4, 3)), r"value must be .* got \(2, 4, 3\)"),
        ((randn(2, 5, 8), randn(4, 8)), r"query \(2, 5, 8\), key \(4, 8\)"),
    ],
)
def test_forward_bad_input_raises_shape_error(args, match):
    module = make_module(d_model=8, n_heads=2)
    with pytest.raises(ShapeError, match=match):
        module(*args)


def test_forward_batched_query_with_unbatched_key_of_batch_length():
    module = make_module(d_model=8, n_heads=2)
    with pytest.raises(ShapeError, match=r"all be batched .*query \(2, 5, 8\), key \(2, 8\)"):
        module(randn(2, 5, 8), randn(2, 8))


def test_forward_non_tensor_query():
    module = make_module(d_model=8, n_heads=2)
    with pytest.raises(ShapeError, match=r"query must be a tensor, got list"):
        module([[0.0] * 8] * 3)


def test_self_attention_wrong_width():
    module = SelfAttention(5, 3)
    with pytest.raises(ShapeError, match=r"x must be \(batch, seq, 5\) or \(seq, 5\), got \(2, 4, 6\)"):
        module(randn(2, 4, 6, dtype=torch.float32))


def test_kv_cache_refuses_keys_that_do_not_fit():
    from selfattn.attention.kv_cache import KVCache

    cache = KVCache()
    with pytest.raises(ShapeError, match=r"same length: key \(1, 2, 3, 4\), value \(1, 2, 2, 4\)"):
        cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 2, 4))
    cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ShapeError, match="do not fit the cached keys"):
        cache.append(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(ShapeError, match="do not fit the cached values"):
        cache.append(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 5))
    with pytest.raises(ShapeError, match="torch.float64"):
        cache.append(torch.zeros(1, 2, 1, 4, dtype=torch.float64), torch.zeros(1, 2, 1, 4, dtype=torch.float64))
    assert cache.length == 3


@pytest.mark.parametrize("impl", ["reference", "flash"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_structured_masks_match_torch_multihead_attention_given_the_dense_mask(impl, is_causal):
    """A rule from selfattn.masks in the module; torch's module gets the same mask as a matrix."""
    from selfattn.attention.interop import from_torch
    from selfattn.masks import DocumentMask, SlidingWindowMask

    torch.manual_seed(0)
    torch_mha = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    copied = from_torch(torch_mha)
    ours = MultiHeadAttention.from_config(dataclasses.replace(copied.config, attn_impl=impl)).eval()
    ours.load_state_dict(copied.state_dict())
    x = 4 * torch.randn(2, 9, 16)  # large inputs: weights far from uniform
    rule = SlidingWindowMask(9, left=2, right=1) & DocumentMask([4, 5])
    allowed = rule.dense() & (torch.ones(9, 9, dtype=torch.bool).tril() if is_causal else True)
    expected, _ = torch_mha(x, x, x, attn_mask=~allowed, need_weights=False)  # torch: True = hidden
    got = ours(x, attn_mask=rule, is_causal=is_causal)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask", [torch.ones(5, 5, dtype=torch.int64).tril(), torch.ones(5, 5, dtype=torch.uint8), [[True]]])
def test_masks_that_are_neither_bool_nor_float_are_refused(mask):
    """Added as a bias, a 0/1 integer mask would hide nothing; torch's SDPA refuses it too."""
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ShapeError, match="attn_mask must be"):
        mha(torch.randn(1, 5, 8), attn_mask=mask)


def test_the_old_name_of_d_head_still_works_and_warns():
    """head_dim was the per-head width's old name (issue 27 made it d_head everywhere): it still
    builds the same module, and says what to write instead."""
    from selfattn.attention.config import TransformerConfig
    from selfattn.models.decoder import DecoderConfig

    with pytest.warns(DeprecationWarning, match=r"MultiHeadAttention\(head_dim=\.\.\.\) is now d_head"):
        old = make_module(d_model=6, n_heads=3, head_dim=4)
    new = make_module(d_model=6, n_heads=3, d_head=4)
    assert old.config == new.config and old.w_q.weight.shape == (12, 6)
    torch.testing.assert_close(old(randn(2, 5, 6)), new(randn(2, 5, 6)), atol=0, rtol=0)
    with pytest.warns(DeprecationWarning, match=r"AttentionConfig\(head_dim=\.\.\.\) is now d_head"):
        config = AttentionConfig(d_model=6, n_heads=3, head_dim=4)
    assert config.d_head == 4
    with pytest.warns(DeprecationWarning, match=r"\.head_dim is now \.d_head"):
        assert config.head_dim == 4
    with pytest.warns(DeprecationWarning, match=r"\.head_size is now \.d_head"):
        assert config.head_size == 4
    with pytest.warns(DeprecationWarning):
        assert TransformerConfig(d_model=6, n_heads=3, head_dim=4).attention.d_head == 4
    with pytest.raises(ConfigError, match="give d_head only"), pytest.warns(DeprecationWarning):
        AttentionConfig(d_model=6, n_heads=3, head_dim=4, d_head=2)
    decoder = dict(model_type="gpt2", vocab_size=10, d_model=6, n_layers=1, n_heads=3, n_kv_heads=3, d_ff=8, activation="gelu", norm="layer",
                   norm_eps=1e-5, positional="learned", max_positions=8, bias=True, attention_bias=True, out_bias=True,
                   tie_embeddings=True)
    with pytest.warns(DeprecationWarning, match=r"DecoderConfig\(head_dim=\.\.\.\) is now d_head"):
        assert DecoderConfig(head_dim=2, **decoder) == DecoderConfig(d_head=2, **decoder)
    assert AttentionConfig(d_model=6, n_heads=3).d_head == 2  # the default, resolved when built
