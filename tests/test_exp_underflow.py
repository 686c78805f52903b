"""Peaked softmaxes: exp of very negative numbers, flushed to exact zeros on the CPU.

On the CPU, torch's exp of inputs below about -87 and arithmetic on subnormal numbers take
slow paths (measured 80-200x); the kernel clamps such inputs and zeroes what is too small to
matter (``kernels.online_softmax.exp_flush_tiny_``). Checked here against torch.exp (value by
value, and that no subnormal number comes out), and the whole of flash attention on peaked
inputs against torch's SDPA: outputs, lse and gradients, with and without masks.
"""

from __future__ import annotations

import math

import pytest
import torch

import selfattn.kernels.flash_backward as flash_backward_module
from selfattn.kernels.flash_backward import backward_may_underflow
from selfattn.kernels.online_softmax import exp_floor, exp_flush_tiny_, online_softmax_start, online_softmax_update
from selfattn.masks import CausalMask, SlidingWindowMask
from selfattn.kernels.flash import flash_attention
from test_flash_masks import as_bias, check_against_torch, grads_of, qkv, randn, torch_reference

NEG_INF = float("-inf")


def subnormal(x: torch.Tensor) -> torch.Tensor:
    return (x != 0) & (x.abs() < torch.finfo(x.dtype).tiny)


def spread(dtype) -> torch.Tensor:
    """Inputs from 0 down past every underflow, -inf included."""
    return torch.cat([torch.linspace(-1500.0, 0.0, 30001, dtype=dtype), torch.tensor([NEG_INF], dtype=dtype)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_flush_equals_exp_where_it_matters_and_zero_below(dtype):
    x = spread(dtype)
    floor = exp_floor(x)
    assert floor == pytest.approx(math.log(torch.finfo(dtype).tiny) + 8.0)
    result = exp_flush_tiny_(x.clone())
    kept = x > floor + 1.0
    torch.testing.assert_close(result[kept], torch.exp(x[kept]), rtol=0, atol=0)  # bit for bit where kept
    assert bool((result[x <= floor] == 0).all())
    assert not bool(subnormal(result).any())
    # What is dropped is below exp(floor + 1): nothing against a row whose largest term is 1.
    dropped = result[~kept] == 0
    assert float(torch.exp(x[~kept].double())[dropped].max()) <= math.exp(floor + 1.0)


def test_floors_per_dtype_and_none_where_nothing_is_flushed():
    assert exp_floor(torch.zeros(1)) == pytest.approx(-79.34, abs=0.01)
    assert exp_floor(torch.zeros(1, dtype=torch.float64)) == pytest.approx(-700.4, abs=0.1)
    assert exp_floor(torch.zeros(1, dtype=torch.float16)) is None  # its floor would be -1.7
    half = torch.tensor([-20.0, -1.0, 0.0], dtype=torch.float16)
    torch.testing.assert_close(exp_flush_tiny_(half.clone()), torch.exp(half), rtol=0, atol=0)
    capped = exp_flush_tiny_(torch.tensor([-200.0, 0.0, 60.0]), cap=50.0)
    torch.testing.assert_close(capped, torch.tensor([0.0, 1.0, math.exp(50.0)]))


def test_online_softmax_update_leaves_no_subnormal_weights():
    scores = torch.tensor([[0.0, -50.0, -95.0, -300.0, NEG_INF], [NEG_INF] * 5])
    state = online_softmax_start((2,), 1, scores)
    update = online_softmax_update(state, scores.clone(), torch.ones(5, 1))
    assert not bool(subnormal(update.exp).any())
    torch.testing.assert_close(update.exp[0], torch.tensor([1.0, math.exp(-50.0), 0.0, 0.0, 0.0]))
    assert bool((update.exp[1] == 0).all())  # a row with nothing visible yet stays empty
    torch.testing.assert_close(update.state.l[:, 0], torch.tensor([1.0 + math.exp(-50.0), 0.0]))


PEAKED_MASKS = {
    "none": (None, None),
    "causal": (CausalMask(9), CausalMask(9).dense()),
    "window": (SlidingWindowMask(9, left=2, right=1), SlidingWindowMask(9, left=2, right=1).dense()),
}


def peaked_case(name, dtype, factor):
    mask, dense = PEAKED_MASKS[name]
    q, k, v = qkv(2, 3, 3, 9, 9, dtype=dtype, seed=5)
    q = q * factor  # logits spread over hundreds: most probabilities underflow
    bias = torch.zeros(9, 9, dtype=torch.float64) if dense is None else as_bias(dense)
    scores = (q.double() @ k.double().transpose(-2, -1)) / 2.0
    assert float((scores.amax(-1, keepdim=True) - scores).amax()) > 150  # really peaked
    return (q, k, v), mask, bias


@pytest.mark.parametrize("name", list(PEAKED_MASKS))
@pytest.mark.parametrize("factor", [40.0, 400.0])
def test_peaked_attention_against_torch_in_float64(name, factor):
    tensors, mask, bias = peaked_case(name, torch.float64, factor)
    check_against_torch(tensors, mask, bias, torch.float64, block_q=4, block_k=3)


@pytest.mark.parametrize("name", list(PEAKED_MASKS))
@pytest.mark.parametrize("factor", [40.0, 400.0])
def test_peaked_attention_in_float32_within_the_rounding_of_lse(name, factor):
    """In float32 a score of hundreds is rounded by ~1e-5, and so is lse: exp(S - lse) of the
    largest term carries that relative error into O and the gradients, in any kernel that keeps
    lse (torch's flash kernel too). Flash against the float64 answer, within 4 float32 epsilons
    times the largest |score|, relative to each result's size (at least 1)."""
    tensors, mask, bias = peaked_case(name, torch.float32, factor)
    q, k, _ = tensors
    upstream = randn(2, 3, 9, 3, dtype=torch.float32, seed=99)
    out, _, grads = grads_of(lambda *t: flash_attention(*t, attn_mask=mask, block_q=4, block_k=3), tensors, upstream)
    exact_out, _, exact_grads = torch_reference([t.double() for t in tensors], bias, upstream.double())
    largest_score = float((q.double() @ k.double().transpose(-2, -1)).abs().amax()) / 2.0
    relative = 4 * torch.finfo(torch.float32).eps * largest_score
    for name_, ours, exact in zip(("O", "dQ", "dK", "dV"), (out, *grads), (exact_out, *exact_grads)):
        error = float((ours.double() - exact).abs().max())
        assert error <= relative * max(float(exact.abs().max()), 1.0), (name_, error, relative)


def test_backward_flushes_only_when_it_may_underflow():
    q, k, _ = qkv(1, 2, 2, 16, 16, d=8, dtype=torch.float32)
    lse = torch.zeros(1, 2, 16)
    assert not backward_may_underflow(q, k, 8**-0.5, None, lse)  # ordinary scores: S - lse >= -8 or so
    assert backward_may_underflow(q * 100, k, 8**-0.5, None, lse)
    assert backward_may_underflow(q, k, 8**-0.5, None, lse.index_fill(-1, torch.tensor([3]), NEG_INF))
    assert not backward_may_underflow(q * 100, k, 8**-0.5, None, lse.half())  # float16: no flushing


def test_flushing_backward_equals_the_plain_one_where_nothing_underflows(monkeypatch):
    q, k, v = qkv(2, 2, 2, 12, 10, d=8, d_v=5, dtype=torch.float64)
    upstream = randn(2, 2, 12, 5, seed=3)

    def grads():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flash_attention(*leaves, is_causal=True, block_q=4, block_k=3)
        return torch.autograd.grad(out, leaves, upstream)

    plain = grads()
    monkeypatch.setattr(flash_backward_module, "backward_may_underflow", lambda *args: True)
    flushed = grads()
    for a, b in zip(plain, flushed):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

