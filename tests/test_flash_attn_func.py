"""flash_attn_func against a reference written from flash-attn's documented semantics (flash_attn_reference.py).

The reference (flash-attn's README and docstrings): tensors (batch, seqlen, nheads,
headdim); query i sits at key position i + seqlen_k - seqlen_q; window_size (left, right)
keeps keys j with i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right
(-1 unbounded), causal is right = 0; softcap c: s = c tanh(s / c) on the scaled scores;
ALiBi: s -= slope |i + seqlen_k - seqlen_q - j|; a query that sees nothing gives zeros.
The grid of lengths and head sizes follows flash-attn's own tests.
"""

from __future__ import annotations

import math

import pytest
import torch

import selfattn as sa
from flash_attn_reference import reference

SEQLENS = [(113, 203), (128, 217), (108, 256), (256, 128), (1, 37), (37, 1)]
HEAD_DIMS = [32, 59, 111]


CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "local": dict(window=(20, 7)),
    "local-causal": dict(window=(33, -1), causal=True),
    "alibi": dict(slopes="heads"),
    "alibi-causal": dict(slopes="batch", causal=True),
    "softcap": dict(softcap=2.0, causal=True),
    "everything": dict(softcap=3.0, slopes="heads", window=(15, 4), scale=0.3),
}


def _inputs(q_len, kv_len, d, heads=4, kv_heads=2, batch=2, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_len, heads, d, generator=g, dtype=dtype)
    k = torch.randn(batch, kv_len, kv_heads, d, generator=g, dtype=dtype)
    v = torch.randn(batch, kv_len, kv_heads, d, generator=g, dtype=dtype)
    return q, k, v


def _options(case: dict, batch: int, heads: int) -> tuple[dict, dict]:
    ours, theirs = {}, {}
    for name, value in case.items():
        if name == "slopes":
            g = torch.Generator().manual_seed(9)
            slopes = torch.rand(heads, generator=g) if value == "heads" else torch.rand(batch, heads, generator=g)
            ours["alibi_slopes"], theirs["slopes"] = slopes, slopes
        elif name == "window":
            ours["window_size"], theirs["window"] = value, value
        elif name == "scale":
            ours["softmax_scale"], theirs["scale"] = value, value
        else:
            ours[name], theirs[name] = value, value
    return ours, theirs


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seqlens", SEQLENS, ids=str)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_matches_flash_attn_semantics_in_float64(case, seqlens, d):
    q, k, v = _inputs(*seqlens, d)
    ours_opts, ref_opts = _options(CASES[case], 2, 4)
    out, lse, probs = sa.flash_attn_func(q, k, v, return_attn_probs=True, **ours_opts)
    expected, expected_probs = reference(q, k, v, **ref_opts)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(probs, expected_probs, atol=1e-10, rtol=1e-10)
    assert lse.shape == (2, 4, seqlens[0])


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("case", ["causal", "local", "everything"])
def test_float32_error_and_gradients_within_flash_attns_criterion(heads, kv_heads, case):
    """flash-attn's test criterion: our float32 error against float64 at most 2x PyTorch's own
    (the dense formula in float32), gradients at most 3x."""
    q, k, v = _inputs(113, 203, 59, heads, kv_heads)
    ours_opts, ref_opts = _options(CASES[case], 2, heads)
    exact = [t.clone().requires_grad_() for t in (q, k, v)]
    single = [t.float().requires_grad_() for t in (q, k, v)]
    mine = [t.float().requires_grad_() for t in (q, k, v)]
    grad = torch.randn(2, 113, heads, 59, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    out64 = reference(*exact, **ref_opts)[0]
    out32 = reference(*single, **{n: (x.float() if isinstance(x, torch.Tensor) else x) for n, x in ref_opts.items()})[0]
    ours = sa.flash_attn_func(*mine, **{n: (x.float() if isinstance(x, torch.Tensor) else x) for n, x in ours_opts.items()})
    for out, tensors in ((out64, exact), (out32, single), (ours, mine)):
        out.backward(grad.to(out.dtype))
    assert (ours.double() - out64).abs().max() <= 2 * (out32.double() - out64).abs().max() + 1e-6
    for a, b, c in zip(mine, single, exact):
        assert (a.grad.double() - c.grad).abs().max() <= 3 * (b.grad.double() - c.grad).abs().max() + 1e-5


def test_a_query_whose_window_is_empty_gives_zeros():
    q, k, v = _inputs(8, 40, 16)
    out, lse, _ = sa.flash_attn_func(q, k, v, window_size=(0, 0), return_attn_probs=True)  # query i sees key i + 32 only
    expected, _ = reference(q, k, v, window=(0, 0))
    torch.testing.assert_close(out, expected)
    q, k, v = _inputs(40, 8, 16)  # more queries than keys, causal bottom-right: the first 32 see nothing
    out, lse, _ = sa.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert bool((out[:, :32] == 0).all()) and bool(torch.isneginf(lse[:, :, :32]).all())
    torch.testing.assert_close(out, reference(q, k, v, causal=True)[0])


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(dropout_p=1.5), "dropout_p"),
        (dict(window_size=(-2, 0)), "window sizes"),
        (dict(window_size=(3,)), "window_size"),
        (dict(softcap=-1.0), "softcap"),
        (dict(alibi_slopes=torch.ones(3)), "alibi_slopes"),
    ],
)
def test_bad_options_are_one_line(options, message):
    q, k, v = _inputs(5, 5, 8)
    with pytest.raises(sa.SelfAttnError) as caught:
        sa.flash_attn_func(q, k, v, **options)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_layout_is_checked():
    with pytest.raises(sa.ShapeError, match="batch, seqlen, nheads, headdim"):
        sa.flash_attn_func(torch.zeros(5, 4, 8), torch.zeros(5, 4, 8), torch.zeros(5, 4, 8))


VARLEN = {"q": [5, 17, 1, 30, 12], "k": [9, 17, 4, 22, 12]}  # per sequence; some have more keys, one fewer


@pytest.mark.parametrize("case", CASES)
def test_varlen_equals_each_sequence_on_its_own(case):
    """Packed sequences: each one's result is flash-attn's reference on that sequence alone."""
    g = torch.Generator().manual_seed(2)
    lens_q, lens_k = VARLEN["q"], VARLEN["k"]
    q = torch.randn(sum(lens_q), 4, 24, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(sum(lens_k), 2, 24, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(sum(lens_k), 2, 24, generator=g, dtype=torch.float64, requires_grad=True)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    ours_opts, ref_opts = _options(CASES[case], len(lens_q), 4)
    out, lse, probs = sa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_attn_probs=True,
                                                **ours_opts)
    pieces = []
    for s in range(len(lens_q)):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        options = dict(ref_opts)
        if "slopes" in options and options["slopes"].dim() == 2:
            options["slopes"] = options["slopes"][s:s + 1]
        expected, expected_probs = reference(q[None, rows], k[None, keys], v[None, keys], **options)
        pieces.append(expected[0])
        torch.testing.assert_close(probs[:, rows, keys], expected_probs[0], atol=1e-10, rtol=1e-10)
        outside = probs[:, rows].clone()
        outside[:, :, keys] = 0
        assert bool((outside == 0).all())  # no weight on another sequence's keys
    expected = torch.cat(pieces)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(
    "cu_q, cu_k, max_q, message",
    [
        ([0, 5, 3, 10], [0, 4, 8, 12], 7, "must not decrease"),
        ([0, 5, 10], [0, 4, 8, 12], 5, "2 sequences"),
        ([1, 5, 10], [0, 4, 12], 5, "from 0 to total_q"),
        ([0, 5, 9], [0, 4, 12], 5, "from 0 to total_q"),
        ([0, 5, 10], [0, 4, 12], 4, "max_seqlen_q"),
    ],
)
def test_bad_offsets_are_one_line(cu_q, cu_k, max_q, message):
    q, k, v = torch.zeros(10, 2, 8), torch.zeros(12, 2, 8), torch.zeros(12, 2, 8)
    with pytest.raises(sa.ShapeError) as caught:
        sa.flash_attn_varlen_func(q, k, v, torch.tensor(cu_q), torch.tensor(cu_k), max_q, 8)
    assert message in str(caught.value) and "\n" not in str(caught.value)
