"""Dropout inside the flash kernel: the pattern, its scale, and the backward that redraws it.

The references are written here: P = softmax(scale Q K^T + mask) in float64, and
O = (P * Z / (1 - p)) V with autograd through it for the gradients. Z, the kernel's keep
pattern, is read off the kernel itself by attending over V = the identity (then O = P Z /
(1 - p) entry for entry), so the reference needs no knowledge of how Z is drawn; that the
pattern is the same for every block size, seed for seed, is then a test of its own.
"""

from __future__ import annotations

import math

import pytest
import torch
from flash_attn_reference import reference as flash_attn_reference

import selfattn as sa
from selfattn.errors import OptionError

F64 = dict(atol=1e-12, rtol=1e-10)


def seeded(seed: int = 7) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def inputs(batch=2, heads=3, q_len=150, kv_len=170, d=16, kv_heads=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, d, generator=g, dtype=dtype) * 2.0  # far from uniform weights
    k = torch.randn(batch, kv_heads or heads, kv_len, d, generator=g, dtype=dtype)
    v = torch.randn(batch, kv_heads or heads, kv_len, d, generator=g, dtype=dtype)
    return q, k, v


def keep_pattern(q, k, p, seed=7, **options):
    """Z (..., q_len, kv_len) as bool, read off the kernel with V = I, and the weights it gave."""
    eye = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-2], k.shape[-2], k.shape[-2])
    dropped = sa.flash_attention(q, k, eye, dropout_p=p, generator=seeded(seed), **options)  # P Z / (1 - p)
    return dropped != 0, dropped


def dense_probs(q, k, mask=None, causal=False, scale=None):
    if k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    scores = q @ k.transpose(-2, -1) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)


@pytest.mark.parametrize("blocks", [(16, 32), (7, 300), (512, 5), (64, 128), (1, 1000)])
def test_the_pattern_does_not_depend_on_the_block_sizes(blocks):
    q, k, v = inputs()
    default = sa.flash_attention(q, k, v, dropout_p=0.3, generator=seeded())
    tiled = sa.flash_attention(q, k, v, dropout_p=0.3, generator=seeded(), block_q=blocks[0], block_k=blocks[1])
    torch.testing.assert_close(tiled, default, **F64)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_kept_weights_are_the_softmax_over_one_minus_p_and_the_kept_fraction_is_one_minus_p(p):
    q, k, _ = inputs(batch=1, heads=4, q_len=256, kv_len=256)
    keep, dropped = keep_pattern(q, k, p)
    probs = dense_probs(q, k)
    assert abs(keep.double().mean().item() - (1 - p)) < 0.01
    torch.testing.assert_close(dropped, probs * keep / (1 - p), **F64)
    other, _ = keep_pattern(q, k, p, seed=8)
    assert (other != keep).double().mean() > 0.5 * 2 * p * (1 - p)  # another seed, another pattern


@pytest.mark.parametrize("case", ["plain", "causal", "gqa", "window", "rows that see nothing", "q_len > kv_len"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_output_and_gradients_against_the_dense_reference(case, dtype):
    p, options, mask = 0.35, {}, None
    kv_heads = 1 if case == "gqa" else None
    q_len, kv_len = (90, 40) if case == "q_len > kv_len" else (70, 95)
    q, k, v = inputs(q_len=q_len, kv_len=kv_len, kv_heads=kv_heads, dtype=torch.float64)
    if case == "causal":
        options["is_causal"] = True
    if case == "gqa":
        options["enable_gqa"] = True
    if case == "window":
        window = sa.sliding_window_mask(q_len, kv_len, left=9, right=3, structured=True)
        mask, options["attn_mask"] = window.dense(), window
    if case == "rows that see nothing":
        mask = torch.rand(q_len, kv_len, generator=seeded(3)) > 0.3
        mask[5] = False
        options["attn_mask"] = mask
    keep, _ = keep_pattern(q, k, p, **options)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = sa.flash_attention(*leaves, dropout_p=p, generator=seeded(), block_q=32, block_k=48, **options)
    grad_out = torch.randn(out.shape, generator=seeded(11), dtype=dtype)
    got = torch.autograd.grad(out, leaves, grad_out)
    refs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    probs = dense_probs(refs[0], refs[1], mask=mask, causal=options.get("is_causal", False))
    values = refs[2].repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    expected = (probs * keep / (1 - p)) @ values
    expected_grads = torch.autograd.grad(expected, refs, grad_out.double())
    tol = F64 if dtype == torch.float64 else dict(atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.double(), expected, **tol)
    for a, b in zip(got, expected_grads):
        torch.testing.assert_close(a.double(), b, **tol)
    if case == "rows that see nothing":
        assert (out[..., 5, :] == 0).all() and all(torch.isfinite(g).all() for g in got)


@pytest.mark.parametrize("options", [dict(), dict(is_causal=True), dict(enable_gqa=True)])
def test_gradcheck_with_the_seed_fixed(options):
    q, k, v = inputs(batch=1, heads=2, q_len=13, kv_len=13, d=4, kv_heads=1 if options.get("enable_gqa") else None)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    attend = lambda *t: sa.flash_attention(*t, dropout_p=0.4, generator=seeded(), block_q=4, block_k=5, **options)  # noqa: E731
    assert torch.autograd.gradcheck(attend, leaves)


def test_torch_manual_seed_reproduces_a_call_and_lse_is_the_full_softmax():
    q, k, v = inputs(q_len=40, kv_len=40)
    torch.manual_seed(3)
    first, lse = sa.flash_attention(q, k, v, dropout_p=0.2, is_causal=True, return_lse=True)
    torch.manual_seed(3)
    again = sa.flash_attention(q, k, v, dropout_p=0.2, is_causal=True)
    later = sa.flash_attention(q, k, v, dropout_p=0.2, is_causal=True)  # the generator has moved on
    torch.testing.assert_close(again, first, atol=0, rtol=0)
    assert not torch.allclose(later, first)
    _, plain_lse = sa.flash_attention(q, k, v, is_causal=True, return_lse=True)
    torch.testing.assert_close(lse, plain_lse, atol=0, rtol=0)


def test_no_dropout_leaves_the_generator_alone():
    q, k, v = inputs(q_len=8, kv_len=8)
    g = seeded(1)
    sa.flash_attention(q, k, v, dropout_p=0.0, generator=g)
    assert torch.equal(g.get_state(), seeded(1).get_state())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(dropout_p=1.0), r"dropout_p must be a number in \[0, 1\), got 1\.0"),
        (dict(dropout_p=-0.1), r"got -0\.1"),
        (dict(dropout_p=True), r"got True"),
        (dict(dropout_p="0.1"), r"got '0\.1'"),
        (dict(dropout_p=0.1, generator=5), r"generator must be a torch\.Generator or None, got int"),
    ],
)
def test_bad_dropout_options_are_one_line_errors(kwargs, match):
    q, k, v = inputs(q_len=4, kv_len=4)
    with pytest.raises(OptionError, match=match) as error:
        sa.flash_attention(q, k, v, **kwargs)
    assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------- flash-attn's interface


@pytest.mark.parametrize("case", [dict(causal=True), dict(window_size=(20, 5), softcap=3.0), dict(alibi=True)])
def test_flash_attn_func_dropout_against_the_reference_and_its_sign_encoded_pattern(case):
    g = seeded(4)
    q = torch.randn(2, 60, 4, 16, generator=g, dtype=torch.float64) * 2
    k, v = (torch.randn(2, 75, 2, 16, generator=g, dtype=torch.float64) for _ in range(2))
    options = {key: value for key, value in case.items() if key != "alibi"}
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64) if case.get("alibi") else None
    torch.manual_seed(9)
    out, lse, probs = sa.flash_attn_func(q, k, v, dropout_p=0.3, alibi_slopes=slopes, return_attn_probs=True, **options)
    torch.manual_seed(9)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    again = sa.flash_attn_func(*leaves, dropout_p=0.3, alibi_slopes=slopes, **options)
    torch.testing.assert_close(again, out, atol=0, rtol=0)
    window = options.get("window_size", (-1, -1))
    _, plain = flash_attn_reference(q, k, v, causal=options.get("causal", False), window=window,
                                    softcap=options.get("softcap", 0.0), slopes=slopes)
    torch.testing.assert_close(probs.abs(), plain, **F64)  # before dropout, as flash-attn's S_dmask
    kept = probs > 0
    visible = plain > 0
    assert abs(kept[visible].double().mean().item() - 0.7) < 0.02
    values = v.repeat_interleave(2, dim=2).transpose(1, 2)  # (B, H, Sk, D)
    refs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    _, ref_probs = flash_attn_reference(*refs, causal=options.get("causal", False), window=window,
                                        softcap=options.get("softcap", 0.0), slopes=slopes)
    expected = ((ref_probs * kept / 0.7) @ refs[2].repeat_interleave(2, dim=2).transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(out, ((plain * kept / 0.7) @ values).transpose(1, 2), **F64)
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(again, leaves, grad_out), torch.autograd.grad(expected, refs, grad_out)):
        torch.testing.assert_close(a, b, **F64)


def test_flash_attn_varlen_func_dropout_gradcheck_with_the_seed_fixed():
    g = seeded(2)
    q, k, v = (torch.randn(11, 2, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    offsets = torch.tensor([0, 4, 11])

    def attend(q, k, v):
        torch.manual_seed(5)
        return sa.flash_attn_varlen_func(q, k, v, offsets, offsets, 7, 7, dropout_p=0.3, causal=True, softcap=2.0)

    assert torch.autograd.gradcheck(attend, (q, k, v))


# ----------------------------------------------------------------------------- the modules


def test_multihead_attention_drops_inside_the_kernel_while_training():
    torch.manual_seed(0)
    flash = sa.MultiHeadAttention(16, 4, dropout=0.25, attn_impl="flash", bias=False)
    x = torch.randn(2, 33, 16, dtype=torch.float64)
    flash = flash.double()
    flash.eval()
    plain = sa.MultiHeadAttention(16, 4, bias=False).double()
    plain.load_state_dict(flash.state_dict())
    torch.testing.assert_close(flash(x, is_causal=True), plain(x, is_causal=True), **F64)  # eval: no dropout
    flash.train()
    torch.manual_seed(4)
    dropped = flash(x, is_causal=True)
    torch.manual_seed(4)  # the same heads through the kernel by hand, the same seed
    heads = [(x @ w.weight.T).view(2, 33, 4, 4).transpose(1, 2) for w in (flash.w_q, flash.w_k, flash.w_v)]
    by_hand = sa.flash_attention(*heads, is_causal=True, dropout_p=0.25)
    expected = flash.w_o(by_hand.transpose(1, 2).reshape(2, 33, 16))
    torch.testing.assert_close(dropped, expected, **F64)
    assert not torch.allclose(dropped, plain(x, is_causal=True))


def test_configs_accept_flash_with_dropout():
    assert sa.AttentionConfig(8, 2, dropout=0.1, attn_impl="flash").dropout == 0.1
    assert sa.TransformerConfig(8, 2, dropout=0.1, attn_impl="flash").attn_impl == "flash"
