"""scaled_dot_product_attention against torch's: outputs and gradients, masks, GQA, dropout, errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from selfattn.attention.functional import (
    dropout_weights,
    scaled_dot_product_attention,
    scaled_dot_product_attention_with_weights,
)
from selfattn.errors import OptionError, ShapeError
from selfattn.masks import causal_mask

TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.float64: {"atol": 1e-12, "rtol": 1e-10}}

# (batch, Hq, Hk, q_len, kv_len, d, d_v): odd lengths, q_len < / = / > kv_len, batch 1 and several, d_v != d
SHAPES = [
    (1, 1, 1, 1, 1, 1, 1),
    (1, 2, 2, 5, 5, 4, 4),
    (3, 2, 2, 7, 3, 5, 6),
    (2, 3, 3, 3, 9, 8, 2),
    (1, 1, 1, 11, 11, 3, 5),
]
# grouped-query: Hq = 2 Hk, 4 Hk, and Hk = 1 (multi-query)
GQA_SHAPES = [
    (2, 4, 2, 5, 7, 4, 3),
    (1, 8, 2, 3, 5, 4, 4),
    (2, 3, 1, 6, 4, 2, 5),
    (1, 4, 1, 9, 9, 6, 6),
]
DTYPES = [torch.float32, torch.float64]


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def qkv(batch, hq, hk, q_len, kv_len, d, d_v, dtype=torch.float64, seed=0):
    lead = (batch,) if batch else ()
    query = randn(*lead, hq, q_len, d, dtype=dtype, seed=seed)
    key = randn(*lead, hk, kv_len, d, dtype=dtype, seed=seed + 1)
    value = randn(*lead, hk, kv_len, d_v, dtype=dtype, seed=seed + 2)
    return query, key, value


def bool_mask_keeping_a_key_per_row(shape, seed=0):
    """Random True/False, then one random True per row, so no query row is fully masked."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=generator) > 0.5
    kept = torch.randint(0, shape[-1], (*shape[:-1], 1), generator=generator)
    return mask.scatter(-1, kept, True)


def outputs_and_grads(fn, tensors, upstream, **kwargs):
    leaves = [tensor.detach().clone().requires_grad_() for tensor in tensors]
    output = fn(*leaves, **kwargs)
    grads = torch.autograd.grad(output, leaves, grad_outputs=upstream, allow_unused=True)
    return output.detach(), grads


def assert_matches_torch(query, key, value, torch_kwargs=None, **kwargs):
    """Our output and d/dQ, d/dK, d/dV equal torch's, for the same upstream gradient."""
    torch_kwargs = kwargs if torch_kwargs is None else torch_kwargs
    expected = F.scaled_dot_product_attention(query, key, value, **torch_kwargs)
    upstream = randn(*expected.shape, dtype=query.dtype, seed=99)
    ours, our_grads = outputs_and_grads(scaled_dot_product_attention, (query, key, value), upstream, **kwargs)
    theirs, their_grads = outputs_and_grads(
        F.scaled_dot_product_attention, (query, key, value), upstream, **torch_kwargs
    )
    tol = TOL[query.dtype]
    torch.testing.assert_close(ours, theirs, **tol)
    for name, ours_grad, their_grad in zip("qkv", our_grads, their_grads):
        torch.testing.assert_close(ours_grad, their_grad, **tol, msg=lambda m, name=name: f"d/d{name}: {m}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + GQA_SHAPES)
def test_no_mask_matches_torch(shape, dtype):
    gqa = shape[1] != shape[2]
    assert_matches_torch(*qkv(*shape, dtype=dtype), enable_gqa=gqa)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + GQA_SHAPES)
@pytest.mark.parametrize("mask_shape", ["full", "rows", "keys"])
def test_bool_mask_matches_torch(shape, dtype, mask_shape):
    batch, hq, _, q_len, kv_len, _, _ = shape
    full = {"full": (batch, hq, q_len, kv_len), "rows": (q_len, kv_len), "keys": (batch, 1, 1, kv_len)}[mask_shape]
    mask = bool_mask_keeping_a_key_per_row(full, seed=sum(shape))
    assert_matches_torch(*qkv(*shape, dtype=dtype), attn_mask=mask, enable_gqa=shape[1] != shape[2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + GQA_SHAPES)
def test_float_mask_matches_torch(shape, dtype):
    batch, hq, _, q_len, kv_len, _, _ = shape
    bias = randn(batch, hq, q_len, kv_len, dtype=dtype, seed=7) * 3.0
    assert_matches_torch(*qkv(*shape, dtype=dtype), attn_mask=bias, enable_gqa=shape[1] != shape[2])


@pytest.mark.parametrize("dtype", DTYPES)
def test_float32_mask_is_added_in_the_query_dtype(dtype):
    query, key, value = qkv(2, 2, 2, 4, 6, 3, 3, dtype=dtype)
    bias = randn(4, 6, dtype=torch.float32, seed=3)
    assert_matches_torch(query, key, value, attn_mask=bias, torch_kwargs={"attn_mask": bias.to(dtype)})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + GQA_SHAPES)
def test_is_causal_top_left_matches_torch(shape, dtype):
    assert_matches_torch(*qkv(*shape, dtype=dtype), is_causal=True, enable_gqa=shape[1] != shape[2])


# q_len > kv_len bottom-right leaves rows with no key: that case is in the fully-masked tests below.
CAUSAL_CASES = [("top_left", q, k) for q, k in [(1, 1), (3, 3), (3, 7), (1, 9), (5, 6), (7, 3), (9, 2)]] + [
    ("bottom_right", q, k) for q, k in [(1, 1), (3, 3), (3, 7), (1, 9), (5, 6), (4, 5)]
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("align,q_len,kv_len", CAUSAL_CASES)
def test_causal_masks_match_torch_causal_bias(align, q_len, kv_len, dtype):
    """Top-left against torch's causal_upper_left, bottom-right against causal_lower_right."""
    query, key, value = qkv(2, 3, 3, q_len, kv_len, 4, 5, dtype=dtype)
    mask = causal_mask(q_len, kv_len, align=align)
    reference = (causal_upper_left if align == "top_left" else causal_lower_right)(q_len, kv_len)
    assert_matches_torch(query, key, value, attn_mask=mask, torch_kwargs={"attn_mask": reference})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.1, 1.0, 2.5])
@pytest.mark.parametrize("shape", [SHAPES[2], GQA_SHAPES[0]])
def test_explicit_scale_matches_torch(shape, scale, dtype):
    assert_matches_torch(*qkv(*shape, dtype=dtype), scale=scale, is_causal=True, enable_gqa=shape[1] != shape[2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "q_shape,kv_shape",
    [
        ((5, 4), (7, 4)),  # no batch, no heads
        ((3, 5, 4), (3, 7, 4)),  # heads only
        ((2, 3, 2, 5, 4), (2, 3, 2, 7, 4)),  # extra leading dim
        ((2, 1, 2, 5, 4), (1, 3, 2, 7, 4)),  # broadcast leading dims
    ],
)
def test_leading_dims_match_torch(q_shape, kv_shape, dtype):
    query = randn(*q_shape, dtype=dtype)
    key, value = randn(*kv_shape, dtype=dtype, seed=1), randn(*kv_shape, dtype=dtype, seed=2)
    mask = bool_mask_keeping_a_key_per_row((q_shape[-2], kv_shape[-2]), seed=3)
    assert_matches_torch(query, key, value, attn_mask=mask)
    assert_matches_torch(query, key, value, is_causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gqa_with_extra_leading_dims_matches_torch(dtype):
    query = randn(2, 3, 4, 5, 6, dtype=dtype)
    key, value = randn(2, 3, 2, 7, 6, dtype=dtype, seed=1), randn(2, 3, 2, 7, 3, dtype=dtype, seed=2)
    assert_matches_torch(query, key, value, enable_gqa=True, is_causal=True)


def test_no_keys_gives_zeros_like_torch():
    query, key, value = qkv(2, 2, 2, 3, 0, 4, 5)
    assert_matches_torch(query, key, value)
    assert_matches_torch(query, key, value, is_causal=False, attn_mask=torch.ones(3, 0, dtype=torch.bool))


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    heads=st.integers(1, 4),
    group=st.sampled_from([1, 1, 2, 3]),
    q_len=st.integers(1, 9),
    kv_len=st.integers(1, 9),
    d=st.integers(1, 8),
    d_v=st.integers(1, 8),
    mask_kind=st.sampled_from(["none", "bool", "float", "causal"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_torch_property(batch, heads, group, q_len, kv_len, d, d_v, mask_kind, seed):
    shape = (batch, heads * group, heads, q_len, kv_len, d, d_v)
    query, key, value = qkv(*shape, seed=seed)
    kwargs = {"enable_gqa": group > 1}
    if mask_kind == "bool":
        kwargs["attn_mask"] = bool_mask_keeping_a_key_per_row((batch, heads * group, q_len, kv_len), seed=seed)
    elif mask_kind == "float":
        kwargs["attn_mask"] = randn(batch, 1, q_len, kv_len, seed=seed + 5) * 4.0
    elif mask_kind == "causal":
        kwargs["is_causal"] = True
    assert_matches_torch(query, key, value, **kwargs)


# Fully masked rows: zeros (torch gives NaN), finite gradients, the other rows unchanged.


def assert_zero_rows_and_finite_grads(query, key, value, masked_rows, **kwargs):
    """Rows in ``masked_rows`` (bool, (..., q_len)) have zero output and weights; every gradient is finite."""
    leaves = [tensor.detach().clone().requires_grad_() for tensor in (query, key, value)]
    output, weights = scaled_dot_product_attention_with_weights(*leaves, **kwargs)
    assert not output.isnan().any() and not weights.isnan().any()
    rows = masked_rows.expand(output.shape[:-1])
    torch.testing.assert_close(output[rows], torch.zeros_like(output[rows]), atol=0, rtol=0)
    torch.testing.assert_close(weights[rows], torch.zeros_like(weights[rows]), atol=0, rtol=0)
    torch.testing.assert_close(
        weights.sum(-1), (~masked_rows).to(weights.dtype).expand(weights.shape[:-1]), **TOL[query.dtype]
    )
    grads = torch.autograd.grad(output, leaves, grad_outputs=torch.ones_like(output))
    for grad in grads:
        assert torch.isfinite(grad).all()
    return grads


def test_fully_masked_bool_rows_are_zero_and_others_match_torch():
    query, key, value = qkv(2, 2, 2, 5, 4, 3, 3)
    mask = bool_mask_keeping_a_key_per_row((2, 2, 5, 4), seed=4)
    masked_rows = torch.zeros(2, 2, 5, dtype=torch.bool)
    masked_rows[0, 1, 2] = masked_rows[1, 0, 0] = masked_rows[1, 1, 4] = True
    mask = mask & ~masked_rows[..., None]
    assert_zero_rows_and_finite_grads(query, key, value, masked_rows, attn_mask=mask)
    # Reference: torch with the dead rows opened up, and no upstream gradient through them.
    upstream = randn(2, 2, 5, 3, seed=8).masked_fill(masked_rows[..., None], 0.0)
    ours, our_grads = outputs_and_grads(scaled_dot_product_attention, (query, key, value), upstream, attn_mask=mask)
    opened = mask | masked_rows[..., None]
    theirs, their_grads = outputs_and_grads(
        F.scaled_dot_product_attention, (query, key, value), upstream, attn_mask=opened
    )
    torch.testing.assert_close(ours[~masked_rows], theirs[~masked_rows], **TOL[torch.float64])
    for ours_grad, their_grad in zip(our_grads, their_grads):
        torch.testing.assert_close(ours_grad, their_grad, **TOL[torch.float64])


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_false_mask_gives_zeros_and_zero_gradients(dtype):
    query, key, value = qkv(2, 3, 3, 4, 5, 2, 3, dtype=dtype)
    grads = assert_zero_rows_and_finite_grads(
        query, key, value, torch.ones(4, dtype=torch.bool), attn_mask=torch.zeros(4, 5, dtype=torch.bool)
    )
    for grad in grads:
        torch.testing.assert_close(grad, torch.zeros_like(grad), atol=0, rtol=0)


def test_all_minus_inf_float_mask_gives_zeros():
    query, key, value = qkv(1, 2, 2, 3, 4, 2, 2)
    bias = torch.full((3, 4), float("-inf"), dtype=torch.float64)
    bias[1, 2] = 0.5
    masked_rows = torch.tensor([True, False, True])
    assert_zero_rows_and_finite_grads(query, key, value, masked_rows, attn_mask=bias)
    output = scaled_dot_product_attention(query, key, value, attn_mask=bias)
    torch.testing.assert_close(output[..., 1, :], value[..., 2, :], atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_len,kv_len", [(5, 3), (9, 2), (2, 1), (4, 3)])
def test_bottom_right_causal_with_more_queries_than_keys(q_len, kv_len, dtype):
    """The first q_len - kv_len rows see no key; the rest are torch's square causal attention."""
    query, key, value = qkv(2, 2, 2, q_len, kv_len, 3, 4, dtype=dtype)
    mask = causal_mask(q_len, kv_len, align="bottom_right")
    masked_rows = torch.arange(q_len) < q_len - kv_len
    assert_zero_rows_and_finite_grads(query, key, value, masked_rows, attn_mask=mask)
    upstream = randn(2, 2, q_len, 4, dtype=dtype, seed=5)
    ours, (gq, gk, gv) = outputs_and_grads(scaled_dot_product_attention, (query, key, value), upstream, attn_mask=mask)
    live = slice(q_len - kv_len, None)
    theirs, (tq, tk, tv) = outputs_and_grads(
        F.scaled_dot_product_attention, (query[..., live, :], key, value), upstream[..., live, :], is_causal=True
    )
    tol = TOL[dtype]
    torch.testing.assert_close(ours[..., live, :], theirs, **tol)
    torch.testing.assert_close(gq[..., live, :], tq, **tol)
    dead = gq[..., : q_len - kv_len, :]
    torch.testing.assert_close(dead, torch.zeros_like(dead), atol=0, rtol=0)
    torch.testing.assert_close(gk, tk, **tol)
    torch.testing.assert_close(gv, tv, **tol)


# The weights.


def softmax_reference(query, key, mask, scale):
    """softmax(Q K^T scale + mask) with torch.softmax; GQA by indexing key head h // group per query head."""
    group = query.shape[-3] // key.shape[-3]
    heads = [query[..., h, :, :] @ key[..., h // group, :, :].transpose(-2, -1) for h in range(query.shape[-3])]
    scores = torch.stack(heads, dim=-3) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.softmax(scores, dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2], SHAPES[3], GQA_SHAPES[0], GQA_SHAPES[2]])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_weights_are_softmax_of_scaled_scores(shape, mask_kind, dtype):
    batch, hq, hk, q_len, kv_len, d, _ = shape
    query, key, value = qkv(*shape, dtype=dtype)
    mask = {
        "none": None,
        "bool": bool_mask_keeping_a_key_per_row((q_len, kv_len), seed=2),
        "float": randn(batch, hq, q_len, kv_len, dtype=dtype, seed=2),
    }[mask_kind]
    output, weights = scaled_dot_product_attention_with_weights(query, key, value, attn_mask=mask, enable_gqa=hq != hk)
    expected = softmax_reference(query, key, mask, 1.0 / math.sqrt(d))
    tol = TOL[dtype]
    torch.testing.assert_close(weights, expected, **tol)
    torch.testing.assert_close(weights.sum(-1), torch.ones(batch, hq, q_len, dtype=dtype), **tol)
    values = value.repeat_interleave(hq // hk, dim=-3)
    torch.testing.assert_close(output, weights @ values, **tol)
    plain = scaled_dot_product_attention(query, key, value, mask, enable_gqa=hq != hk)
    torch.testing.assert_close(output, plain, **tol)


def test_weights_with_causal_and_explicit_scale():
    query, key, value = qkv(1, 2, 2, 6, 6, 4, 4)
    _, weights = scaled_dot_product_attention_with_weights(query, key, value, is_causal=True, scale=0.3)
    expected = softmax_reference(query, key, torch.ones(6, 6, dtype=torch.bool).tril(), 0.3)
    torch.testing.assert_close(weights, expected, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(weights.triu(1), torch.zeros_like(weights), atol=0, rtol=0)


# gradcheck in float64.


@pytest.mark.parametrize(
    "kwargs_for",
    [
        lambda: {"attn_mask": bool_mask_keeping_a_key_per_row((3, 4), seed=1)},
        lambda: {"attn_mask": randn(2, 3, 4, seed=4)},
        lambda: {"is_causal": True},
        lambda: {"attn_mask": causal_mask(3, 4, align="bottom_right"), "scale": 0.7},
        lambda: {"attn_mask": torch.tensor([[True, True, False, False], [False] * 4, [True] * 4])},
    ],
)
def test_gradcheck(kwargs_for):
    query, key, value = (t.requires_grad_() for t in qkv(1, 2, 2, 3, 4, 3, 2))
    kwargs = kwargs_for()
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, **kwargs), (query, key, value)
    )


def test_gradcheck_gqa():
    query, key, value = (t.requires_grad_() for t in qkv(1, 4, 2, 3, 5, 2, 3))
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True), (query, key, value)
    )


# Dropout.


def test_dropout_zero_is_no_dropout_and_deterministic():
    query, key, value = qkv(2, 2, 2, 5, 7, 3, 4)
    plain = scaled_dot_product_attention_with_weights(query, key, value)
    for _ in range(3):
        dropped = scaled_dot_product_attention_with_weights(query, key, value, dropout_p=0.0)
        torch.testing.assert_close(dropped.output, plain.output, atol=0, rtol=0)
        torch.testing.assert_close(dropped.weights, plain.weights, atol=0, rtol=0)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.8])
def test_dropout_zeroes_a_fraction_p_and_scales_the_rest(p):
    query, key, value = qkv(4, 4, 4, 32, 32, 8, 3)
    plain = scaled_dot_product_attention_with_weights(query, key, value).weights
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        output, weights = scaled_dot_product_attention_with_weights(query, key, value, dropout_p=p)
    assert (plain > 0).all()  # so a zero weight can only come from dropout
    dropped = weights == 0
    n = weights.numel()
    fraction = dropped.double().mean().item()
    assert abs(fraction - p) <= 4 * math.sqrt(p * (1 - p) / n), f"dropped {fraction:.4f} of {n} weights, p = {p}"
    torch.testing.assert_close(weights[~dropped], plain[~dropped] / (1 - p), atol=0, rtol=1e-15)
    torch.testing.assert_close(output, weights @ value, atol=1e-12, rtol=1e-12)


def test_dropout_mean_over_draws_approaches_the_plain_output():
    p, draws = 0.4, 4000
    query, key, value = qkv(1, 1, 1, 3, 5, 2, 2)
    plain = scaled_dot_product_attention_with_weights(query, key, value)
    with torch.random.fork_rng():
        torch.manual_seed(7)
        # one call, ``draws`` independent masks along a leading axis
        outputs = scaled_dot_product_attention(query.expand(draws, 1, 3, 2), key, value, dropout_p=p)
    # Var(o_i) = p / (1 - p) * sum_j (a_ij v_j)^2 for independent keep ~ Bernoulli(1 - p)
    variance = p / (1 - p) * ((plain.weights[..., None] * value[..., None, :, :]) ** 2).sum(-2)
    bound = 5 * (variance / draws).sqrt()
    error = (outputs.mean(0, keepdim=True) - plain.output).abs()
    assert (error <= bound).all(), f"mean error {error} exceeds 5 sigma {bound}"


def test_dropout_weights_with_a_generator_is_reproducible():
    weights = torch.softmax(randn(3, 6, 6), dim=-1)
    first = dropout_weights(weights, 0.3, generator=torch.Generator().manual_seed(11))
    again = dropout_weights(weights, 0.3, generator=torch.Generator().manual_seed(11))
    other = dropout_weights(weights, 0.3, generator=torch.Generator().manual_seed(12))
    torch.testing.assert_close(first, again, atol=0, rtol=0)
    assert not torch.equal(first, other)
    kept = first != 0
    torch.testing.assert_close(first[kept], weights[kept] / 0.7, atol=0, rtol=1e-15)


# Bad input: a typed error whose message names the shapes or values.

F32 = torch.float32
Q = randn(1, 2, 3, 4, dtype=torch.float32)
K = randn(1, 2, 5, 4, dtype=torch.float32, seed=1)
V = randn(1, 2, 5, 6, dtype=torch.float32, seed=2)


@pytest.mark.parametrize(
    "args,kwargs,error,match",
    [
        ((Q, randn(1, 2, 5, 3, dtype=F32), V), {}, ShapeError, r"d: query \(1, 2, 3, 4\), key \(1, 2, 5, 3\)"),
        ((Q, K, randn(1, 2, 6, 6, dtype=F32)), {}, ShapeError, r"kv_len: .*key \(1, 2, 5, 4\), value \(1, 2, 6, 6\)"),
        ((randn(1, 3, 3, 4, dtype=F32), K, V), {"enable_gqa": True}, ShapeError, r"heads \(3\).*value heads \(2\)"),
        ((randn(1, 4, 3, 4, dtype=F32), K, V), {}, ShapeError, r"do not broadcast: query \(1, 4, 3, 4\)"),
        ((randn(4, 3, 4, dtype=F32), K[0, 0], V[0, 0]), {"enable_gqa": True}, ShapeError, r"heads dim.*key \(5, 4\)"),
        ((Q, K, V), {"attn_mask": torch.ones(3, 7, dtype=torch.bool)}, ShapeError, r"\(3, 7\) .*\(1, 2, 3, 5\)"),
        ((Q, K, V), {"attn_mask": torch.ones(2, 2, 3, 5, dtype=torch.bool)}, ShapeError, r"\(2, 2, 3, 5\) does not"),
        ((Q, K, V), {"attn_mask": torch.ones(3, 5, dtype=torch.int64)}, ShapeError, r"must be bool.*got int64"),
        ((Q, K, V), {"attn_mask": torch.zeros(3, 5, dtype=torch.float16)}, ShapeError, r"float32/float32.*got float16"),
        ((Q, K, V), {"attn_mask": [[True] * 5] * 3}, ShapeError, r"attn_mask must be a tensor, got list"),
        ((Q, K, V), {"dropout_p": -0.1}, OptionError, r"dropout_p must be a number in \[0, 1\), got -0\.1"),
        ((Q, K, V), {"dropout_p": 1.0}, OptionError, r"got 1\.0"),
        ((Q, K, V), {"dropout_p": 1.5}, OptionError, r"got 1\.5"),
        ((Q, K, V), {"dropout_p": True}, OptionError, r"got True"),
        ((Q, K, V), {"dropout_p": "0.1"}, OptionError, r"got '0\.1'"),
        ((Q, K, V), {"dropout_p": float("nan")}, OptionError, r"got nan"),
        ((Q, K, V), {"attn_mask": torch.ones(3, 5, dtype=torch.bool), "is_causal": True}, OptionError, r"not both"),
        (([[1.0] * 4] * 3, K, V), {}, ShapeError, r"query must be a tensor, got list"),
        ((Q, K, 3.0), {}, ShapeError, r"value must be a tensor, got float"),
        ((torch.ones(4), K, V), {}, ShapeError, r"query needs at least 2 dimensions.*query \(4,\)"),
        ((torch.ones(3, 4, dtype=torch.int64), K, V), {}, ShapeError, r"query must be a floating-point .*torch\.int64"),
        ((Q, K, V.double()), {}, ShapeError, r"share a dtype: torch\.float32, torch\.float32, torch\.float64"),
    ],
)
def test_bad_input_raises_a_typed_error_naming_it(args, kwargs, error, match):
    assert issubclass(error, ValueError)
    with pytest.raises(error, match=match):
        scaled_dot_product_attention(*args, **kwargs)
    with pytest.raises(error, match=match):
        scaled_dot_product_attention_with_weights(*args, **kwargs)


@pytest.mark.parametrize("q_len,kv_len", [(3, 5), (4, 4), (1, 6)])
def test_torch_causal_bias_objects_are_accepted_as_masks(q_len, kv_len):
    """Users swapping us in for torch may pass torch's CausalBias objects; they mean the same here."""
    query, key, value = qkv(2, 2, 2, q_len, kv_len, 4, 4, dtype=torch.float64)
    for bias in (causal_upper_left(q_len, kv_len), causal_lower_right(q_len, kv_len)):
        assert_matches_torch(query, key, value, attn_mask=bias, torch_kwargs={"attn_mask": bias})


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_heads_without_a_mask_stack_rows_instead_of_copying_keys(q_len, need_weights):
    from selfattn.attention.functional import attention_forward

    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, q_len, 16, generator=generator, dtype=torch.float64) * 2  # far from uniform
    k = torch.randn(2, 2, 11, 16, generator=generator, dtype=torch.float64) * 2
    v = torch.randn(2, 2, 11, 5, generator=generator, dtype=torch.float64)
    out = attention_forward(q, k, v, enable_gqa=True, need_weights=need_weights, scale=0.3)
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=0.3)
    torch.testing.assert_close(out.output, expected, rtol=0, atol=1e-12)
    if need_weights:
        weights = torch.softmax(0.3 * q @ k.repeat_interleave(4, dim=1).transpose(-1, -2), dim=-1)
        torch.testing.assert_close(out.weights, weights, rtol=0, atol=1e-12)
        assert out.weights.max() > 0.9
