"""The step functions against independent references: PyTorch's SDPA and softmax."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn import (
    ShapeError,
    attention_scores,
    attention_scores_loop,
    context_vector_loop,
    context_vectors,
    self_attention,
    softmax,
    softmax_naive,
    softmax_parts,
    softmax_stable,
)


def sdpa_unscaled(x: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(x, x, x, scale=1.0)


def test_self_attention_matches_sdpa_on_the_seed(seed_x):
    torch.testing.assert_close(self_attention(seed_x), sdpa_unscaled(seed_x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (7, 3), (13, 8), (64, 32), (2, 3, 9, 4)])
def test_self_attention_matches_sdpa_on_random_inputs(shape, dtype):
    generator = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=generator, dtype=dtype)
    torch.testing.assert_close(self_attention(x), sdpa_unscaled(x))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 24),
    d=st.integers(1, 16),
    spread=st.floats(0.01, 30.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_self_attention_matches_sdpa_property(n, d, spread, seed):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * spread
    torch.testing.assert_close(self_attention(x), sdpa_unscaled(x))


def test_gradients_match_sdpa():
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ours = x.clone().requires_grad_()
    theirs = x.clone().requires_grad_()
    upstream = torch.randn(6, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (self_attention(ours) * upstream).sum().backward()
    (sdpa_unscaled(theirs) * upstream).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad)


def test_gradcheck_self_attention_and_softmax():
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(self_attention, (x,))
    assert torch.autograd.gradcheck(softmax_stable, (x,))


@pytest.mark.parametrize("n,d", [(1, 1), (7, 3), (11, 5)])
def test_loop_forms_equal_matrix_forms(n, d):
    generator = torch.Generator().manual_seed(n * 100 + d)
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    for q in range(n):
        scores = attention_scores(x[q], x)
        torch.testing.assert_close(attention_scores_loop(x[q], x), scores)
        torch.testing.assert_close(scores, attention_scores(x, x)[q])
        weights = softmax(scores)
        torch.testing.assert_close(context_vector_loop(weights, x), context_vectors(weights, x))


def test_scores_are_dot_products_and_scale():
    q = torch.tensor([[1.0, 2.0]])
    k = torch.tensor([[3.0, 4.0], [-1.0, 0.5]])
    torch.testing.assert_close(attention_scores(q, k), torch.tensor([[11.0, 0.0]]))
    torch.testing.assert_close(attention_scores(q, k, scale=0.5), torch.tensor([[5.5, 0.0]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_forms_match_torch(dtype):
    scores = torch.randn(4, 9, generator=torch.Generator().manual_seed(5), dtype=dtype) * 3
    expected = torch.softmax(scores, dim=-1)
    torch.testing.assert_close(softmax_stable(scores), expected)
    torch.testing.assert_close(softmax_naive(scores), expected)
    torch.testing.assert_close(softmax(scores, stable=False), expected)
    torch.testing.assert_close(softmax(scores.T, dim=0), torch.softmax(scores.T, dim=0))


def test_stable_softmax_survives_huge_scores_where_naive_overflows():
    scores = torch.tensor([1e4, 1e4 - 1.0, -1e4, 0.0], dtype=torch.float32)
    # Paper formula, evaluated by hand: weights of the two top scores are 1/(1+e^-1) and e^-1/(1+e^-1).
    top = 1.0 / (1.0 + math.exp(-1.0))
    expected = torch.tensor([top, 1.0 - top, 0.0, 0.0], dtype=torch.float32)
    torch.testing.assert_close(softmax_stable(scores), expected)
    torch.testing.assert_close(softmax_stable(-scores), torch.softmax(-scores, dim=-1))
    assert torch.isnan(softmax_naive(scores)).any()  # exp(1e4) is inf in float32
    parts = softmax_parts(scores)
    assert float(parts.shift) == 1e4 and float(parts.exp.max()) == 1.0


def test_stable_softmax_gives_zeros_for_a_fully_masked_row():
    scores = torch.tensor([[0.5, -math.inf, 1.0], [-math.inf, -math.inf, -math.inf]], requires_grad=True)
    weights = softmax_stable(scores)
    torch.testing.assert_close(weights[1], torch.zeros(3))
    torch.testing.assert_close(weights[0], torch.softmax(scores[0].detach(), dim=-1))
    weights.sum().backward()
    assert torch.isfinite(scores.grad).all()


def test_shape_errors_name_the_shapes():
    with pytest.raises(ShapeError, match=r"query \(2, 3\), keys \(4, 5\)"):
        attention_scores(torch.zeros(2, 3), torch.zeros(4, 5))
    with pytest.raises(ShapeError, match=r"weights \(2, 3\), values \(4, 5\)"):
        context_vectors(torch.zeros(2, 3), torch.zeros(4, 5))
    with pytest.raises(ShapeError):
        attention_scores_loop(torch.zeros(2, 3), torch.zeros(4, 3))
    with pytest.raises(ShapeError):
        context_vector_loop(torch.zeros(3), torch.zeros(4, 3))
    with pytest.raises(ShapeError, match=r"weights \(3,\), values \(2,\)"):
        context_vectors(torch.ones(3), torch.ones(2))  # a vector of values: was an IndexError
    with pytest.raises(ShapeError, match=r"X must be \(\.\.\., n, d\).*\(3,\)"):
        self_attention(torch.ones(3))
    assert issubclass(ShapeError, ValueError)
