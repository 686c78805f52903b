"""softmax_attention: the reference attention with its backward written out (what training takes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_upper_left

import selfattn as sa
from selfattn.attention import softmax_attention as module


def _inputs(q_len, kv_len, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((2, 3, q_len, 4), (2, 3, kv_len, 4), (2, 3, kv_len, 5))
    return [(3 * torch.randn(s, generator=g, dtype=dtype)).requires_grad_() for s in shapes]


def _masks(q_len, kv_len):
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(q_len, kv_len, generator=g) > 0.4
    keep[:, 0] = True
    return {"none": (None, False), "causal": (None, True), "bool": (keep, False),
            "float": (torch.randn(2, 1, q_len, kv_len, generator=g, dtype=torch.float64), False)}


@pytest.mark.parametrize(("q_len", "kv_len"), [(1, 1), (5, 7), (7, 5), (33, 33)])
@pytest.mark.parametrize("kind", ["none", "causal", "bool", "float"])
def test_outputs_and_gradients_match_torch_sdpa(q_len, kv_len, kind):
    q, k, v = _inputs(q_len, kv_len)
    mask, causal = _masks(q_len, kv_len)[kind]
    calls = []
    real = module._SoftmaxAttention.apply
    module._SoftmaxAttention.apply = lambda *a: calls.append(1) or real(*a)
    try:
        ours = sa.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    finally:
        module._SoftmaxAttention.apply = real
    assert calls == [1]  # the written-out backward really ran
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_upper_left(q_len, kv_len) if causal else mask)
    grad = torch.randn_like(ours)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v), grad), torch.autograd.grad(theirs, (q, k, v), grad)):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-11)


def test_gradcheck_in_float64():
    q, k, v = _inputs(4, 6)
    keep = _masks(4, 6)["bool"][0]
    assert torch.autograd.gradcheck(lambda q, k, v: module.softmax_attention(q, k, v, 0.5, keep, False), (q, k, v))


def test_float32_with_peaked_scores_against_float64():
    # Scores in the hundreds: most exps underflow, the masked keys are -inf; both stay off torch's slow path.
    q, k, v = (t.detach().float().mul(10).requires_grad_() for t in _inputs(16, 16))
    out = sa.scaled_dot_product_attention(q, k, v, is_causal=True)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*exact, is_causal=True)
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    grad = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad.float()), torch.autograd.grad(ref, exact, grad)):
        torch.testing.assert_close(a.double(), b, atol=2e-3, rtol=1e-3)


def test_a_row_with_no_key_keeps_the_plain_steps_answer():
    q, k, v = _inputs(3, 4)
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[1] = False
    assert not module.takes_written_out_backward(q, k, v, keep, 0.0, False)
    ours = sa.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    plain = sa.attention_steps(q, k, v, attn_mask=keep).output
    torch.testing.assert_close(ours, plain, equal_nan=True)


def test_what_it_declines():
    q, k, v = _inputs(3, 4)
    learnable = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    assert not module.takes_written_out_backward(q, k, v, learnable, 0.0, False)  # its gradient is the plain steps'
    assert not module.takes_written_out_backward(q, k, v, None, 0.1, False)  # dropout
    assert not module.takes_written_out_backward(q, k, v, None, 0.0, True)  # weights wanted
    assert not module.takes_written_out_backward(q, k[:1], v[:1], None, 0.0, False)  # broadcast batch
    wide = torch.ones(5, 2, 3, 3, 4, dtype=torch.bool)
    assert not module.takes_written_out_backward(q, k, v, wide, 0.0, False)  # a mask that widens the scores


def test_differentiating_twice_is_refused_not_wrong():
    q, k, v = _inputs(3, 3)
    out = module.softmax_attention(q, k, v, 0.5, None, True)
    (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        gq.sum().backward()
