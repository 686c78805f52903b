"""The fast path (attention_forward without tracing) against PyTorch and against our traced steps.

Without gradients it overwrites the score matrix in place, adds a broadcast bool mask
as 0/-inf, divides by the row sums after the product with V, and skips the row-max
shift when a bound proves exp cannot overflow. Each of those must give the same
numbers as torch's SDPA and as ``attention_steps``, leave the inputs untouched, and
keep fully masked rows at zero.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn import MultiHeadAttention, padding_mask
from selfattn.attention.functional import attention_forward, attention_steps, exp_is_safe
from selfattn.pipeline.steps import softmax_numerators, softmax_numerators_unshifted, softmax_rows

TOL = {torch.float32: dict(rtol=1e-5, atol=2e-6), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def qkv(batch, heads, q_len, kv_len, d, dtype=torch.float32, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(batch, heads, n, d, generator=g, dtype=dtype) for n in (q_len, kv_len, kv_len)]


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 2), heads=st.integers(1, 3), q_len=st.integers(1, 9), kv_len=st.integers(1, 9),
    d=st.integers(1, 8), dtype=st.sampled_from([torch.float32, torch.float64]), size=st.sampled_from([0.1, 1.0, 30.0]),
    mask_kind=st.sampled_from(["none", "padding", "dense", "float", "causal"]), need_weights=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_no_grad_path_matches_torch_and_the_traced_steps(batch, heads, q_len, kv_len, d, dtype, size, mask_kind, need_weights, seed):
    q, k, v = qkv(batch, heads, q_len, kv_len, d, dtype, size, seed)
    g = torch.Generator().manual_seed(seed + 1)
    kwargs = {}
    if mask_kind == "padding":
        kwargs["attn_mask"] = padding_mask(torch.randint(0, kv_len + 1, (batch,), generator=g), kv_len)
    elif mask_kind == "dense":
        kwargs["attn_mask"] = torch.rand(batch, heads, q_len, kv_len, generator=g) < 0.7
    elif mask_kind == "float":
        kwargs["attn_mask"] = torch.randn(q_len, kv_len, generator=g, dtype=dtype)
    elif mask_kind == "causal":
        kwargs["is_causal"] = True
    before = [t.clone() for t in (q, k, v)] + ([kwargs["attn_mask"].clone()] if "attn_mask" in kwargs else [])
    with torch.no_grad():
        fast = attention_forward(q, k, v, need_weights=need_weights, **kwargs)
    traced = attention_steps(q, k, v, **kwargs)
    torch.testing.assert_close(fast.output, traced.output, **TOL[dtype])
    if need_weights:
        torch.testing.assert_close(fast.weights, traced.weights, **TOL[dtype])
    else:
        assert fast.weights is None
    # torch gives NaN for rows with no visible key in some versions; compare the others.
    # torch rounds the scores differently (it splits the scale between q and k): an
    # error of eps * |score| in a score moves the output by up to that times |v|.
    expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
    visible = traced.weights.sum(dim=-1, keepdim=True) > 0
    eps = torch.finfo(dtype).eps
    largest_score = float(q.abs().amax() * k.abs().amax()) * d / math.sqrt(d)
    atol = TOL[dtype]["atol"] + 8 * eps * largest_score * float(v.abs().amax())
    torch.testing.assert_close(
        fast.output * visible, torch.nan_to_num(expected) * visible, rtol=TOL[dtype]["rtol"], atol=atol
    )
    assert torch.isfinite(fast.output).all()
    assert bool((fast.output[~visible.expand_as(fast.output)] == 0).all())
    for original, now in zip(before, [q, k, v] + ([kwargs["attn_mask"]] if "attn_mask" in kwargs else [])):
        assert torch.equal(original, now), "the fast path must not modify its inputs"


def test_huge_scores_take_the_shifted_path_and_stay_exact():
    q, k, v = qkv(1, 2, 5, 7, 4, scale=60.0)  # scores in the thousands: exp(score) overflows float32
    assert not exp_is_safe(q, k, 0.5, None)
    with torch.no_grad():
        out = attention_forward(q, k, v).output
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=1e-5)


def test_the_exp_bound_follows_cauchy_schwarz():
    q = torch.zeros(1, 1, 2, 4)
    k = torch.zeros(1, 1, 3, 4)
    q[..., 0], k[..., 0] = 8.0, 8.0  # |q||k| = 64, the largest score with scale 1
    assert exp_is_safe(q, k, 1.0, None)  # 64 + log 3 < log(float32 max) - 8 = 80.7
    assert not exp_is_safe(q, k, 1.3, None)  # 83.2 > 80.7
    assert not exp_is_safe(q, k, 0.1, torch.zeros(2, 3))  # a float bias is never bounded
    assert exp_is_safe(q, k, 1.0, torch.ones(2, 3, dtype=torch.bool))  # bool masks only add -inf
    assert exp_is_safe(q.double(), k.double(), 5.0, None)  # float64 has room for far larger scores
    limit = math.log(torch.finfo(torch.float32).max) - 8.0
    assert abs(limit - 80.72) < 0.01


@pytest.mark.parametrize("numerators", [softmax_numerators, softmax_numerators_unshifted])
def test_softmax_numerators_give_the_softmax(numerators):
    scores = torch.randn(3, 4, 6) * 5
    scores[0, 1] = float("-inf")  # a fully masked row
    scores[1, 2, :3] = float("-inf")
    exp, total = numerators(scores.clone())
    weights = exp / total
    expected = torch.nan_to_num(torch.softmax(scores, dim=-1))
    torch.testing.assert_close(weights, expected, rtol=1e-6, atol=1e-7)
    assert bool((weights[0, 1] == 0).all())


def test_softmax_rows_in_place_and_not():
    scores = torch.randn(4, 5) * 3
    scores[2] = float("-inf")
    expected = torch.nan_to_num(torch.softmax(scores, dim=-1))
    torch.testing.assert_close(softmax_rows(scores), expected)
    copy = scores.clone()
    result = softmax_rows(copy, in_place=True)
    assert result.data_ptr() == copy.data_ptr()
    torch.testing.assert_close(result, expected)
    assert softmax_rows(torch.empty(3, 0)).shape == (3, 0)


def test_gradients_still_flow_through_the_plain_path():
    q, k, v = (t.requires_grad_() for t in qkv(2, 2, 4, 5, 3, dtype=torch.float64))
    mask = padding_mask([5, 2], 5)
    ours = attention_forward(q, k, v, attn_mask=mask, need_weights=False).output
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    grads = torch.autograd.grad(ours.sum(), (q, k, v))
    expected = torch.autograd.grad(ref.sum(), (q, k, v))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


def test_stacked_projection_matches_separate_ones_and_follows_weight_changes():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, 2).eval()
    x = torch.randn(2, 6, 16)
    with_grad = mha(x)  # parameters require grad: three separate products
    with torch.no_grad():
        stacked = mha(x)
    torch.testing.assert_close(stacked, with_grad, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        mha.w_k.weight.mul_(2.0)  # an in-place change (as an optimizer step makes) must not hit a stale stack
        changed = mha(x)
    torch.testing.assert_close(changed, mha(x), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(changed, stacked)
    mha = mha.double()
    with torch.no_grad():
        torch.testing.assert_close(mha(x.double()), mha.w_o(mha.steps(x.double()).concat), rtol=1e-12, atol=1e-12)


def test_cross_attention_does_not_stack():
    torch.manual_seed(1)
    mha = MultiHeadAttention(8, 2, kdim=5, vdim=3)
    x, context = torch.randn(1, 4, 8), torch.randn(1, 6, 5)
    values = torch.randn(1, 6, 3)
    with torch.no_grad():
        out = mha(x, context, values)
    torch.testing.assert_close(out, mha.steps(x, context, values).output)


def test_the_reused_score_buffer_never_leaks_into_results():
    from selfattn.attention.functional import SCORE_BUFFER_BYTES, score_buffer

    q, k, v = qkv(1, 2, 6, 6, 4)
    with torch.no_grad():
        first = attention_forward(q, k, v, need_weights=False).output
        kept = first.clone()
        second = attention_forward(q * 3, k, v, need_weights=False).output  # reuses the same buffer
        weights = attention_forward(q, k, v, need_weights=True).weights  # returned: never the buffer
        attention_forward(q * 5, k, v, need_weights=False)
    assert torch.equal(first, kept)
    assert not torch.allclose(first, second)
    torch.testing.assert_close(weights, attention_steps(q, k, v).weights)
    big = torch.empty(1, 1, 4096, 1)
    assert score_buffer(big, torch.empty(1, 1, SCORE_BUFFER_BYTES // 4 // 4096 + 1, 1)) is None  # too big to keep
