"""packed_self_attention (what a training step's self-attention takes) and the layouts softmax_attention folds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from selfattn.attention import packed_attention
from selfattn.attention.modules import MultiHeadAttention
from selfattn.attention.packed_attention import packed_self_attention
from selfattn.attention.softmax_attention import softmax_attention
from selfattn.attention.kv_cache import KVCache


def _projection(batch, seq, width, heads, bias, dtype, seed=0):
    """X and peaked weights (scores of several units: attention far from uniform)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, width, generator=g, dtype=dtype).requires_grad_()
    weights = [(torch.randn(width, width, generator=g, dtype=dtype) * 1.5 / width ** 0.25).requires_grad_() for _ in range(3)]
    biases = [torch.randn(width, generator=g, dtype=dtype).requires_grad_() for _ in range(3)] if bias else None
    return x, weights, biases


def _reference(x, weights, biases, heads, causal):
    """The same layer in plain torch: three Linear products, heads split, torch's SDPA, heads joined."""
    batch, seq, width = x.shape
    split = []
    for i, w in enumerate(weights):
        y = F.linear(x, w, None if biases is None else biases[i])
        split.append(y.view(batch, seq, heads, width // heads).transpose(1, 2))  # (batch, H, seq, head_dim)
    out = F.scaled_dot_product_attention(*split, is_causal=causal)
    return out.transpose(1, 2).reshape(batch, seq, width)


@pytest.mark.parametrize(("batch", "seq", "width", "heads"), [(1, 1, 6, 2), (2, 7, 12, 3), (3, 33, 16, 4), (2, 5, 8, 1)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_outputs_and_gradients_match_torch_in_float64(batch, seq, width, heads, causal, bias):
    x, weights, biases = _projection(batch, seq, width, heads, bias, torch.float64)
    ours = packed_self_attention(x, weights, biases, heads, causal)
    theirs = _reference(x, weights, biases, heads, causal)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)
    leaves = [x, *weights, *(biases or [])]
    grad = torch.randn_like(ours)
    for a, b in zip(torch.autograd.grad(ours, leaves, grad), torch.autograd.grad(theirs, leaves, grad)):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-11)


def test_float32_is_far_from_uniform_and_close_to_float64():
    x, weights, biases = _projection(2, 16, 16, 4, True, torch.float32, seed=3)
    ours = packed_self_attention(x, weights, biases, 4, True)
    exact = [t.detach().double() for t in (x, *weights, *biases)]
    reference = _reference(exact[0], exact[1:4], exact[4:], 4, True)
    torch.testing.assert_close(ours.double(), reference, atol=1e-4, rtol=1e-4)
    x = x.detach()
    scores = (x @ weights[0].T + biases[0]).view(2, 16, 4, 4).transpose(1, 2)
    keys = (x @ weights[1].T + biases[1]).view(2, 16, 4, 4).transpose(1, 2)
    top = torch.softmax((scores @ keys.transpose(-1, -2) / 2 + torch.full((16, 16), float("-inf")).triu(1)).detach(), -1).amax(-1)
    assert float(top[..., 4:].mean()) > 0.5  # rows past the first few put most weight on one key


def test_gradcheck():
    x, weights, biases = _projection(2, 5, 6, 2, True, torch.float64, seed=1)
    assert torch.autograd.gradcheck(
        lambda x, *p: packed_self_attention(x, p[:3], p[3:], 2, True), (x, *weights, *biases))


def test_differentiating_twice_is_refused_not_wrong():
    x, weights, biases = _projection(1, 4, 6, 2, True, torch.float64)
    (gx,) = torch.autograd.grad(packed_self_attention(x, weights, biases, 2, True).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        gx.sum().backward()


def _spy(monkeypatch):
    calls = []
    real = packed_attention._PackedSelfAttention.apply
    monkeypatch.setattr(packed_attention._PackedSelfAttention, "apply", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("bias", [True, False])
def test_the_module_trains_through_it_and_agrees_with_its_evaluation(monkeypatch, bias):
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3, bias=bias).double()
    x = torch.randn(2, 9, 12, dtype=torch.float64, requires_grad=True)
    calls = _spy(monkeypatch)
    trained = mha(x, is_causal=True)
    assert calls == [1]
    with torch.no_grad():
        evaluated = mha(x, is_causal=True)  # the stacked inference path
    torch.testing.assert_close(trained, evaluated, atol=1e-12, rtol=1e-12)
    grads = torch.autograd.grad(trained.sum(), [x, *mha.parameters()])
    expected = torch.autograd.grad(mha.w_o(mha.steps(x, is_causal=True).concat).sum(), [x, *mha.parameters()])
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-11)


def test_what_the_module_keeps_on_its_other_paths(monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, requires_grad=True)
    calls = _spy(monkeypatch)
    mha = MultiHeadAttention(8, 2)
    mha(x, attn_mask=torch.ones(5, 5, dtype=torch.bool))  # a mask of the user's
    mha(x, need_weights=True)
    mha(x, torch.randn(2, 3, 8))  # cross-attention
    mha(x, cache=KVCache())
    MultiHeadAttention(8, 2, n_kv_heads=1)(x)  # grouped heads
    MultiHeadAttention(8, 2, positional="rope")(x)
    MultiHeadAttention(8, 2, dropout=0.5).train()(x)
    with torch.no_grad():
        mha(x)
    assert calls == []
    mha(x)
    assert calls == [1]


def test_a_fused_optimiser_step_is_seen_by_the_next_evaluation():
    # AdamW(fused=True) changes the weights in place without bumping their version: the stacked
    # inference weights must not outlive a training forward or a switch to eval.
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 5, 8)
    optimizer = torch.optim.AdamW(mha.parameters(), lr=0.1, fused=True)
    with torch.no_grad():
        before = mha(x)
    mha(x).square().sum().backward()
    optimizer.step()
    with torch.no_grad():
        after = mha(x)
    torch.testing.assert_close(after, mha.w_o(mha.steps(x).concat).detach(), atol=1e-6, rtol=1e-6)
    assert not torch.allclose(after, before)
    with torch.no_grad():
        for p in mha.parameters():
            p.grad = torch.ones_like(p)
    optimizer.step()  # no forward in between this time: eval() drops the stack
    mha.eval()
    with torch.no_grad():
        torch.testing.assert_close(mha(x), mha.w_o(mha.steps(x).concat), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mask", ["none", "causal", "float"])
def test_softmax_attention_folds_heads_stored_head_by_head(mask):
    # Q, K, V as (batch, heads, seq, d) views of (heads, batch, seq, d) storage: folded without a copy.
    g = torch.Generator().manual_seed(2)
    stored = [(2 * torch.randn(3, 2, 6, 4, generator=g, dtype=torch.float64)).requires_grad_() for _ in range(3)]
    q, k, v = (t.transpose(0, 1) for t in stored)  # (2, 3, 6, 4), strided
    attn_mask = torch.randn(2, 1, 6, 6, generator=g, dtype=torch.float64) if mask == "float" else None
    ours = softmax_attention(q, k, v, 0.5, attn_mask, mask == "causal")
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=mask == "causal", scale=0.5)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)
    grad = torch.randn_like(ours)
    for a, b in zip(torch.autograd.grad(ours, stored, grad), torch.autograd.grad(theirs, stored, grad)):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-11)
