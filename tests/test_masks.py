"""Mask builders against loops, torch.tril and torch's CausalBias; masks used in attention against torch."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from selfattn.attention.functional import scaled_dot_product_attention
from selfattn.errors import OptionError, ShapeError
from selfattn.masks import (
    causal_bottom_right,
    causal_mask,
    causal_top_left,
    combine_masks,
    padding_mask,
    sliding_window_mask,
    to_additive,
    user_mask,
)

LENGTHS = [(1, 1), (1, 5), (5, 1), (3, 3), (4, 7), (7, 4), (6, 6), (2, 9), (9, 2)]


def loop_mask(q_len, kv_len, allowed):
    """M[i][j] = allowed(i, j), one entry at a time."""
    return torch.tensor([[allowed(i, j) for j in range(kv_len)] for i in range(q_len)], dtype=torch.bool).reshape(
        q_len, kv_len
    )


def assert_same_mask(actual, expected):
    assert actual.dtype == torch.bool, actual.dtype
    torch.testing.assert_close(actual, expected, atol=0, rtol=0)


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# Causal masks.


@pytest.mark.parametrize("q_len,kv_len", LENGTHS)
def test_causal_top_left_against_loop_tril_and_torch(q_len, kv_len):
    expected = loop_mask(q_len, kv_len, lambda i, j: j <= i)
    assert_same_mask(causal_top_left(q_len, kv_len), expected)
    assert_same_mask(causal_mask(q_len, kv_len), expected)
    assert_same_mask(causal_mask(q_len, kv_len, align="top_left"), expected)
    assert_same_mask(torch.ones(q_len, kv_len, dtype=torch.bool).tril(), expected)
    assert_same_mask(causal_upper_left(q_len, kv_len)._materialize(), expected)


@pytest.mark.filterwarnings("ignore:Lower right causal bias will produce NaNs:UserWarning")
@pytest.mark.parametrize("q_len,kv_len", LENGTHS)
def test_causal_bottom_right_against_loop_tril_and_torch(q_len, kv_len):
    expected = loop_mask(q_len, kv_len, lambda i, j: j <= kv_len - q_len + i)
    assert_same_mask(causal_bottom_right(q_len, kv_len), expected)
    assert_same_mask(causal_mask(q_len, kv_len, align="bottom_right"), expected)
    assert_same_mask(torch.ones(q_len, kv_len, dtype=torch.bool).tril(diagonal=kv_len - q_len), expected)
    assert_same_mask(causal_lower_right(q_len, kv_len)._materialize(), expected)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_square_causal_alignments_agree_and_kv_len_defaults_to_q_len(n):
    expected = torch.ones(n, n, dtype=torch.bool).tril()
    assert_same_mask(causal_mask(n), expected)
    assert_same_mask(causal_top_left(n), expected)
    assert_same_mask(causal_bottom_right(n), expected)


def test_causal_mask_is_torch_is_causal_in_attention():
    query, key, value = randn(2, 3, 5, 4), randn(2, 3, 8, 4, seed=1), randn(2, 3, 8, 2, seed=2)
    expected = F.scaled_dot_product_attention(query, key, value, is_causal=True)
    ours = scaled_dot_product_attention(query, key, value, attn_mask=causal_top_left(5, 8))
    torch.testing.assert_close(ours, expected, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: causal_mask(3, 4, align="middle"), OptionError, r"unknown causal alignment 'middle'"),
        (lambda: causal_mask(-1), ShapeError, r"q_len must be an integer >= 0, got -1"),
        (lambda: causal_mask(3, 2.0), ShapeError, r"kv_len must be an integer >= 0, got 2\.0"),
        (lambda: causal_top_left(True), ShapeError, r"q_len .* got True"),
        (lambda: causal_bottom_right(3, "4"), ShapeError, r"kv_len .* got '4'"),
    ],
)
def test_causal_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# Sliding windows.


def window_loop(q_len, kv_len, left, right, align):
    offset = kv_len - q_len if align == "bottom_right" else 0
    return loop_mask(q_len, kv_len, lambda i, j: i + offset - left <= j <= i + offset + right)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("q_len,kv_len", LENGTHS)
@pytest.mark.parametrize("left,right", [(0, 0), (1, 0), (2, 0), (3, 1), (0, 2), (2, 2)])
def test_sliding_window_against_loop(q_len, kv_len, left, right, align):
    mask = sliding_window_mask(q_len, kv_len, left=left, right=right, align=align)
    assert_same_mask(mask, window_loop(q_len, kv_len, left, right, align))


@settings(max_examples=40, deadline=None)
@given(
    q_len=st.integers(0, 9),
    kv_len=st.integers(0, 9),
    left=st.integers(0, 10),
    right=st.integers(0, 10),
    align=st.sampled_from(["top_left", "bottom_right"]),
)
def test_sliding_window_property(q_len, kv_len, left, right, align):
    mask = sliding_window_mask(q_len, kv_len, left=left, right=right, align=align)
    assert_same_mask(mask, window_loop(q_len, kv_len, left, right, align))


@pytest.mark.parametrize("q_len,kv_len", LENGTHS)
def test_sliding_window_limits_and_combinations(q_len, kv_len):
    wide = max(q_len, kv_len)
    # an unbounded left side and no right side is the causal mask
    assert_same_mask(sliding_window_mask(q_len, kv_len, left=wide), causal_top_left(q_len, kv_len))
    assert_same_mask(sliding_window_mask(q_len, kv_len, left=wide, align="top_left"), causal_top_left(q_len, kv_len))
    assert_same_mask(sliding_window_mask(q_len, kv_len, left=wide, align="bottom_right"), causal_bottom_right(q_len, kv_len))
    # unbounded both sides allows everything
    all_true = torch.ones(q_len, kv_len, dtype=torch.bool)
    assert_same_mask(sliding_window_mask(q_len, kv_len, left=wide, right=wide), all_true)
    # a window of 3 inside the causal mask, combined
    window = sliding_window_mask(q_len, kv_len, left=2, right=4, align="bottom_right")
    combined = combine_masks(causal_bottom_right(q_len, kv_len), window)
    assert_same_mask(combined, window_loop(q_len, kv_len, 2, 0, "bottom_right"))
    combined = combine_masks(causal_top_left(q_len, kv_len), sliding_window_mask(q_len, kv_len, left=2, right=4))
    assert_same_mask(combined, window_loop(q_len, kv_len, 2, 0, "top_left"))
    # kv_len defaults to q_len
    assert_same_mask(sliding_window_mask(q_len, left=1), window_loop(q_len, q_len, 1, 0, "bottom_right"))


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("q_len,kv_len,left", [(5, 5, 1), (3, 8, 2), (7, 7, 3)])
def test_sliding_window_attention_equals_torch_on_each_window(q_len, kv_len, left, align):
    """Row i of windowed attention is torch's attention of query i over its window of keys alone."""
    query, key, value = randn(2, 2, q_len, 3), randn(2, 2, kv_len, 3, seed=1), randn(2, 2, kv_len, 4, seed=2)
    mask = sliding_window_mask(q_len, kv_len, left=left, align=align)
    ours = scaled_dot_product_attention(query, key, value, attn_mask=mask)
    for i in range(q_len):
        pos = kv_len - q_len + i if align == "bottom_right" else i
        window = slice(max(pos - left, 0), pos + 1)
        expected = F.scaled_dot_product_attention(query[..., i : i + 1, :], key[..., window, :], value[..., window, :])
        torch.testing.assert_close(ours[..., i : i + 1, :], expected, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"left": -1}, OptionError, r"left size must be an integer >= 0, got -1"),
        ({"left": 1, "right": -2}, OptionError, r"right size .* got -2"),
        ({"left": 1.5}, OptionError, r"got 1\.5"),
        ({"left": True}, OptionError, r"got True"),
        ({"left": 1, "align": "center"}, OptionError, r"unknown causal alignment 'center'"),
    ],
)
def test_sliding_window_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        sliding_window_mask(4, 5, **kwargs)


# Padding.


@pytest.mark.parametrize(
    "lengths,kv_len", [([3], None), ([1, 4, 2], None), ([0, 5], 5), ([2, 2, 2], 6), (torch.tensor([4, 1]), 7)]
)
def test_padding_mask_against_loop(lengths, kv_len):
    mask = padding_mask(lengths, kv_len)
    lengths = [int(n) for n in lengths]
    width = max(lengths) if kv_len is None else kv_len
    assert mask.shape == (len(lengths), 1, 1, width)
    expected = torch.tensor([[j < n for j in range(width)] for n in lengths], dtype=torch.bool)
    assert_same_mask(mask[:, 0, 0, :], expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lengths,q_len,kv_len", [([3, 7, 1], 4, 7), ([5], 5, 5), ([2, 6], 3, 9)])
def test_padding_mask_equals_attention_on_truncated_keys(lengths, q_len, kv_len, dtype):
    """Batch item b with a padding mask is torch's attention over its first lengths[b] keys."""
    batch, heads = len(lengths), 2
    query = randn(batch, heads, q_len, 3, dtype=dtype).requires_grad_()
    key = randn(batch, heads, kv_len, 3, seed=1, dtype=dtype).requires_grad_()
    value = randn(batch, heads, kv_len, 4, seed=2, dtype=dtype).requires_grad_()
    upstream = randn(batch, heads, q_len, 4, seed=3, dtype=dtype)
    output = scaled_dot_product_attention(query, key, value, attn_mask=padding_mask(lengths, kv_len))
    grad_q, grad_k, grad_v = torch.autograd.grad(output, (query, key, value), upstream)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-10}
    for b, n in enumerate(lengths):
        q, k, v = (t[b].detach().clone().requires_grad_() for t in (query, key[:, :, :n], value[:, :, :n]))
        expected = F.scaled_dot_product_attention(q, k, v)
        expected_grads = torch.autograd.grad(expected, (q, k, v), upstream[b])
        torch.testing.assert_close(output[b], expected, **tol)
        torch.testing.assert_close(grad_q[b], expected_grads[0], **tol)
        torch.testing.assert_close(grad_k[b, :, :n], expected_grads[1], **tol)
        torch.testing.assert_close(grad_v[b, :, :n], expected_grads[2], **tol)
        padded = grad_k[b, :, n:], grad_v[b, :, n:]
        for grad in padded:
            torch.testing.assert_close(grad, torch.zeros_like(grad), atol=0, rtol=0)


def test_padding_mask_with_zero_length_gives_zero_rows():
    query, key, value = randn(2, 1, 3, 2), randn(2, 1, 4, 2, seed=1), randn(2, 1, 4, 2, seed=2)
    output = scaled_dot_product_attention(query, key, value, attn_mask=padding_mask([0, 4]))
    torch.testing.assert_close(output[0], torch.zeros(1, 3, 2, dtype=torch.float64), atol=0, rtol=0)
    expected = F.scaled_dot_product_attention(query[1], key[1], value[1])
    torch.testing.assert_close(output[1], expected, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    "lengths,kv_len,match",
    [
        ([[1, 2]], None, r"1-D sequence of integers, got shape \(1, 2\)"),
        ([1.0, 2.0], None, r"got shape \(2,\) of float32"),
        ([True, False], None, r"of bool"),
        ([2, -1], None, r"must be >= 0, got \[2, -1\]"),
        ([2, 5], 4, r"a key length \(5\) exceeds kv_len \(4\)"),
        ([2, 3], 3.5, r"kv_len must be an integer >= 0, got 3\.5"),
        ([0], -1, r"kv_len must be an integer >= 0, got -1"),
    ],
)
def test_padding_mask_bad_input(lengths, kv_len, match):
    with pytest.raises(ShapeError, match=match):
        padding_mask(lengths, kv_len)


# User masks.


@pytest.mark.parametrize(
    "given",
    [
        [[1, 0, 1], [0, 1, 1]],
        torch.tensor([[1, 0, 1], [0, 1, 1]], dtype=torch.uint8),
        torch.tensor([[1, 0, 1], [0, 1, 1]], dtype=torch.int64),
        [[True, False, True], [False, True, True]],
    ],
)
def test_user_mask_accepts_bool_and_zero_one_integers(given):
    expected = torch.tensor([[True, False, True], [False, True, True]])
    assert_same_mask(user_mask(given), expected)
    assert_same_mask(user_mask(given, q_len=2, kv_len=3), expected)


def test_user_mask_keeps_leading_dims():
    mask = torch.rand(2, 3, 4, 5, generator=torch.Generator().manual_seed(0)) > 0.5
    assert_same_mask(user_mask(mask, 4, 5), mask)


@pytest.mark.parametrize(
    "given,q_len,kv_len,match",
    [
        ([[0, 2], [1, 1]], None, None, r"bool or 0/1 integers .*got int64"),
        ([[0.0, 1.0]], None, None, r"got float32"),
        (torch.tensor([[1 + 0j, 0j]]), None, None, r"got complex64"),
        ("causal", None, None, r"got str"),
        ([1, 0, 1], None, None, r"at least 2 dimensions .*got shape \(3,\)"),
        ([[1, 0, 1]], 2, None, r"last two axes are \(1, 3\), expected \(q_len, kv_len\) = \(2, 3\)"),
        ([[1, 0, 1]], None, 4, r"= \(1, 4\)"),
    ],
)
def test_user_mask_rejects_others(given, q_len, kv_len, match):
    with pytest.raises(ShapeError, match=match):
        user_mask(given, q_len, kv_len)


@settings(max_examples=40, deadline=None)
@given(
    q_len=st.integers(1, 6),
    kv_len=st.integers(1, 6),
    data=st.data(),
)
def test_user_mask_property_round_trips_and_matches_torch_in_attention(q_len, kv_len, data):
    rows = data.draw(
        st.lists(
            st.lists(st.integers(0, 1), min_size=kv_len, max_size=kv_len).filter(any),
            min_size=q_len,
            max_size=q_len,
        )
    )
    mask = user_mask(rows, q_len, kv_len)
    assert_same_mask(mask, torch.tensor(rows) == 1)
    query, key, value = randn(1, 2, q_len, 3), randn(1, 2, kv_len, 3, seed=1), randn(1, 2, kv_len, 2, seed=2)
    torch.testing.assert_close(
        scaled_dot_product_attention(query, key, value, attn_mask=mask),
        F.scaled_dot_product_attention(query, key, value, attn_mask=mask),
        atol=1e-12,
        rtol=1e-10,
    )


# Additive masks and combinations.


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_to_additive_is_zero_or_minus_inf_and_attends_the_same(dtype):
    mask = causal_bottom_right(4, 6)
    additive = to_additive(mask, dtype)
    assert additive.dtype == dtype
    expected = torch.where(mask, torch.tensor(0.0, dtype=dtype), torch.tensor(float("-inf"), dtype=dtype))
    torch.testing.assert_close(additive, expected, atol=0, rtol=0)
    query = randn(2, 4, 3, dtype=dtype)
    key, value = randn(2, 6, 3, seed=1, dtype=dtype), randn(2, 6, 3, seed=2, dtype=dtype)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-10}
    torch.testing.assert_close(
        scaled_dot_product_attention(query, key, value, attn_mask=additive),
        F.scaled_dot_product_attention(query, key, value, attn_mask=mask),
        **tol,
    )
    bias = randn(4, 6, dtype=torch.float32)
    torch.testing.assert_close(to_additive(bias, dtype), bias.to(dtype), atol=0, rtol=0)


def test_combine_masks_of_nothing_is_none():
    assert combine_masks() is None
    assert combine_masks(None, None) is None


def test_combine_bool_masks_is_their_broadcast_and():
    causal = causal_bottom_right(3, 5)  # (3, 5)
    padding = padding_mask([4, 2], 5)  # (2, 1, 1, 5)
    combined = combine_masks(causal, None, padding)
    assert combined.shape == (2, 1, 3, 5)
    expected = torch.tensor(
        [[[j <= 2 + i and j < n for j in range(5)] for i in range(3)] for n in (4, 2)], dtype=torch.bool
    )
    assert_same_mask(combined[:, 0], expected)
    assert_same_mask(combine_masks(causal), causal)
    assert_same_mask(combine_masks(None, causal, None), causal)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_combine_float_and_bool_masks_adds_biases(dtype):
    causal = causal_top_left(3, 4)
    bias_a, bias_b = randn(3, 4, dtype=torch.float32), randn(2, 1, 4, seed=1, dtype=dtype)
    combined = combine_masks(bias_a, None, causal, bias_b, dtype=dtype)
    assert combined.dtype == dtype and combined.shape == (2, 3, 4)
    expected = torch.empty(2, 3, 4, dtype=dtype)
    for h in range(2):
        for i in range(3):
            for j in range(4):
                hidden = float("-inf") if j > i else 0.0
                expected[h, i, j] = float(bias_a[i, j]) + float(bias_b[h, 0, j]) + hidden
    torch.testing.assert_close(combined, expected, atol=1e-6 if dtype == torch.float32 else 1e-12, rtol=0)
    torch.testing.assert_close(combine_masks(bias_b, dtype=dtype), bias_b, atol=0, rtol=0)


def test_combined_mask_in_attention_equals_torch_with_the_same_parts():
    causal, padding = causal_bottom_right(4, 6), padding_mask([6, 3, 5], 6)
    bias = randn(1, 2, 4, 6, seed=5)
    query, key, value = randn(3, 2, 4, 3), randn(3, 2, 6, 3, seed=1), randn(3, 2, 6, 3, seed=2)
    expected = F.scaled_dot_product_attention(
        query, key, value, attn_mask=bias.masked_fill(~(causal & padding), float("-inf"))
    )
    combined = combine_masks(causal, padding, bias, dtype=torch.float64)
    ours = scaled_dot_product_attention(query, key, value, attn_mask=combined)
    torch.testing.assert_close(ours, expected, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("bad", [torch.ones(3, 3, dtype=torch.int64), torch.ones(3, 3, dtype=torch.uint8), [[True]]])
def test_combine_masks_refuses_masks_that_are_neither_bool_nor_float(bad):
    """Summed as a bias, a 0/1 integer mask would hide nothing next to a causal mask."""
    with pytest.raises(ShapeError, match="each mask must be"):
        combine_masks(bad, causal_mask(3))
