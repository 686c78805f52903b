"""selfattn.attention.interop against torch.nn.MultiheadAttention with the same weights.

torch is the independent reference: every test builds a torch module, copies its weights
into ours and compares outputs, attention weights and gradients. Masks are random but
key 0 always stays visible, so no row is fully masked (torch gives NaN there, ours zeros;
one test shows ours).
"""

from contextlib import nullcontext

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from selfattn.attention.interop import TorchStyleMultiheadAttention, from_torch, torch_masks_to_ours
from selfattn.attention.modules import MultiHeadAttention
from selfattn.errors import ConfigError, OptionError, ShapeError

E, H, N, L, S = 12, 3, 2, 5, 7  # width, heads, batch, q_len, kv_len (odd, L != S)
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=1e-12)}
DTYPES = [torch.float32, torch.float64]


def make_torch(dtype=torch.float32, seed=0, **kwargs) -> nn.MultiheadAttention:
    torch.manual_seed(seed)
    mha = nn.MultiheadAttention(E, H, dtype=dtype, **kwargs).eval()
    with torch.no_grad():  # torch zero-initialises the biases; make them count
        for bias in (mha.in_proj_bias, mha.out_proj.bias):
            if bias is not None:
                bias.normal_()
    return mha


def inputs(dtype, batch_first=False, batch=N, q_len=L, kv_len=S, kdim=E, vdim=E, seed=1):
    """query, key, value in torch's layout: (seq, batch, d), or (batch, seq, d) with batch_first."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_len, E, generator=g, dtype=dtype)
    k = torch.randn(batch, kv_len, kdim, generator=g, dtype=dtype)
    v = torch.randn(batch, kv_len, vdim, generator=g, dtype=dtype)
    return (q, k, v) if batch_first else tuple(x.transpose(0, 1).contiguous() for x in (q, k, v))


def torch_bool_mask(*shape, seed=2) -> torch.Tensor:
    """Random torch-convention mask (True = hidden) that never hides key 0."""
    mask = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < 0.4
    mask[..., 0] = False
    return mask


def torch_float_mask(*shape, dtype, seed=3) -> torch.Tensor:
    """Random additive mask with some -inf entries, never on key 0."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.randn(*shape, generator=g, dtype=dtype)
    return mask.masked_fill(torch_bool_mask(*shape, seed=seed), float("-inf"))


def assert_matches_torch(mha, q, k, v, **kwargs):
    """Our drop-in gives torch's output and weights (same layout, same tolerance per dtype)."""
    ours = TorchStyleMultiheadAttention.from_torch(mha)
    expected_out, expected_w = mha(q, k, v, **kwargs)
    out, w = ours(q, k, v, **kwargs)
    tol = TOL[q.dtype]
    torch.testing.assert_close(out, expected_out, **tol)
    if expected_w is None:
        assert w is None
    else:
        torch.testing.assert_close(w, expected_w, **tol)
    return out, w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kv_len", [L, S])  # self-attention shape and cross-attention
@pytest.mark.parametrize("average", [True, False])
def test_outputs_and_weights_match(dtype, batch_first, kv_len, average):
    mha = make_torch(dtype, batch_first=batch_first)
    q, k, v = inputs(dtype, batch_first, kv_len=kv_len)
    _, w = assert_matches_torch(mha, q, k, v, average_attn_weights=average)
    assert w.shape == ((N, L, kv_len) if average else (N, H, L, kv_len))


@pytest.mark.parametrize("dtype", DTYPES)
def test_true_self_attention_and_batch_one(dtype):
    mha = make_torch(dtype, batch_first=True)
    x, _, _ = inputs(dtype, True, batch=1)
    assert_matches_torch(mha, x, x, x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kdim_vdim_differ(dtype):
    mha = make_torch(dtype, kdim=5, vdim=9)
    assert not mha._qkv_same_embed_dim
    assert_matches_torch(mha, *inputs(dtype, kdim=5, vdim=9), average_attn_weights=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_bias(dtype):
    mha = make_torch(dtype, bias=False)
    ours = from_torch(mha)
    assert ours.w_q.bias is None and ours.w_o.bias is None
    assert_matches_torch(mha, *inputs(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["bool", "float", "bool_per_head", "float_per_head"])
def test_attn_mask(dtype, kind):
    shape = (N * H, L, S) if kind.endswith("per_head") else (L, S)
    mask = torch_bool_mask(*shape) if kind.startswith("bool") else torch_float_mask(*shape, dtype=dtype)
    mha = make_torch(dtype)
    assert_matches_torch(mha, *inputs(dtype), attn_mask=mask, average_attn_weights=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_key_padding_mask(dtype, kind):
    padding = torch.zeros(N, S, dtype=torch.bool)
    padding[0, -3:] = True  # item 0 has 4 real keys, item 1 has all 7
    if kind == "float":
        padding = torch.zeros(N, S, dtype=dtype).masked_fill(padding, float("-inf"))
    for batch_first in (False, True):
        mha = make_torch(dtype, batch_first=batch_first)
        assert_matches_torch(mha, *inputs(dtype, batch_first), key_padding_mask=padding)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kinds", [("bool", "bool"), ("float", "float"), ("bool", "float")])
def test_both_masks(dtype, kinds):
    attn = torch_bool_mask(N * H, L, S) if kinds[0] == "bool" else torch_float_mask(N * H, L, S, dtype=dtype)
    padding = torch_bool_mask(N, S, seed=5)
    if kinds[1] == "float":
        padding = torch_float_mask(N, S, dtype=dtype, seed=6)
    mha = make_torch(dtype)
    with pytest.warns(UserWarning) if kinds[0] != kinds[1] else nullcontext():  # torch warns on mixed types
        assert_matches_torch(mha, *inputs(dtype), attn_mask=attn, key_padding_mask=padding, average_attn_weights=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("need_weights", [True, False])
def test_causal_hint_with_torch_mask(dtype, need_weights):
    # With need_weights=False torch trusts the hint and drops the mask; we apply the mask.
    causal = nn.Transformer.generate_square_subsequent_mask(L, dtype=dtype)
    mha = make_torch(dtype)
    q, _, _ = inputs(dtype)
    assert_matches_torch(mha, q, q, q, attn_mask=causal, is_causal=True, need_weights=need_weights)


def test_causal_hint_without_mask_is_refused_like_torch():
    mha = make_torch()
    q, _, _ = inputs(torch.float32)
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        mha(q, q, q, is_causal=True)
    with pytest.raises(OptionError, match="generate_square_subsequent_mask"):
        TorchStyleMultiheadAttention.from_torch(mha)(q, q, q, is_causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_need_weights_false(dtype):
    mha = make_torch(dtype, batch_first=True)
    assert_matches_torch(mha, *inputs(dtype, True), need_weights=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("average", [True, False])
def test_unbatched(dtype, average):
    q, k, v = (x[:, 0] for x in inputs(dtype))  # (seq, d)
    mha = make_torch(dtype)
    _, w = assert_matches_torch(
        mha, q, k, v, attn_mask=torch_bool_mask(H, L, S), key_padding_mask=torch_bool_mask(S, seed=7),
        average_attn_weights=average,
    )
    assert w.shape == ((L, S) if average else (H, L, S))


def test_gradients_match_in_fp64():
    dtype = torch.float64
    mha = make_torch(dtype)
    ours = TorchStyleMultiheadAttention.from_torch(mha)
    theirs_in = [x.requires_grad_() for x in inputs(dtype)]
    ours_in = [x.detach().clone().requires_grad_() for x in theirs_in]
    mask, padding = torch_float_mask(L, S, dtype=dtype), torch_float_mask(N, S, dtype=dtype, seed=8)
    g = torch.Generator().manual_seed(9)
    up_out, up_w = torch.randn(L, N, E, generator=g, dtype=dtype), torch.randn(N, L, S, generator=g, dtype=dtype)
    for module, args in ((mha, theirs_in), (ours, ours_in)):
        out, w = module(*args, attn_mask=mask, key_padding_mask=padding)
        ((out * up_out).sum() + (w * up_w).sum()).backward()
    tol = TOL[dtype]
    for theirs_x, ours_x in zip(theirs_in, ours_in):
        torch.testing.assert_close(ours_x.grad, theirs_x.grad, **tol)
    inner = ours.inner
    for i, layer in enumerate((inner.w_q, inner.w_k, inner.w_v)):
        rows = slice(i * E, (i + 1) * E)
        torch.testing.assert_close(layer.weight.grad, mha.in_proj_weight.grad[rows], **tol)
        torch.testing.assert_close(layer.bias.grad, mha.in_proj_bias.grad[rows], **tol)
    torch.testing.assert_close(inner.w_o.weight.grad, mha.out_proj.weight.grad, **tol)
    torch.testing.assert_close(inner.w_o.bias.grad, mha.out_proj.bias.grad, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_our_module_with_our_mask_convention(dtype):
    """from_torch then our own forward: batch-first, mask = ~torch_mask."""
    mha = make_torch(dtype, batch_first=True)
    q, k, v = inputs(dtype, True)
    torch_mask = torch_bool_mask(L, S)
    expected_out, expected_w = mha(q, k, v, attn_mask=torch_mask, average_attn_weights=False)
    out, w = from_torch(mha)(q, k, v, attn_mask=~torch_mask, need_weights=True)
    torch.testing.assert_close(out, expected_out, **TOL[dtype])
    torch.testing.assert_close(w, expected_w, **TOL[dtype])


def test_from_torch_copies_and_keeps_settings():
    mha = make_torch(torch.float64, dropout=0.25).train()
    ours = from_torch(mha)
    assert ours.config.n_heads == H and ours.config.dropout == 0.25 and ours.training
    assert ours.w_q.weight.dtype == torch.float64
    torch.testing.assert_close(ours.w_k.weight, mha.in_proj_weight[E : 2 * E], atol=0, rtol=0)
    before = ours.w_q.weight.detach().clone()
    with torch.no_grad():
        mha.in_proj_weight.add_(1.0)
        mha.out_proj.weight.zero_()
    torch.testing.assert_close(ours.w_q.weight, before, atol=0, rtol=0)
    assert bool(ours.w_o.weight.ne(0).any())


@pytest.mark.parametrize("option", [dict(add_bias_kv=True), dict(add_zero_attn=True)])
def test_unsupported_options_are_refused(option):
    with pytest.raises(ConfigError, match=next(iter(option))):
        from_torch(nn.MultiheadAttention(E, H, **option))


def test_from_torch_refuses_other_modules():
    with pytest.raises(ConfigError, match="MultiheadAttention"):
        from_torch(nn.Linear(E, E))


def test_bool_masks_are_inverted():
    attn = torch.tensor([[False, True, False], [True, False, False]])  # torch: True = hidden
    padding = torch.tensor([[False, False, True]])  # key 2 is padding
    ours = torch_masks_to_ours(attn, padding, batch=1, n_heads=4, q_len=2, kv_len=3, dtype=torch.float32)
    expected = torch.tensor([[[[True, False, False], [False, True, False]]]])  # (1, 1, 2, 3), True = may attend
    assert ours.dtype == torch.bool
    torch.testing.assert_close(ours, expected, atol=0, rtol=0)
    assert torch_masks_to_ours(None, None, batch=1, n_heads=1, q_len=2, kv_len=3, dtype=torch.float32) is None


def test_float_masks_are_kept_and_summed():
    attn = torch.tensor([[0.5, -1.0]])
    padding = torch.tensor([[True, False], [False, False]])
    ours = torch_masks_to_ours(attn, padding, batch=2, n_heads=1, q_len=1, kv_len=2, dtype=torch.float64)
    expected = torch.tensor([[[[float("-inf"), -1.0]]], [[[0.5, -1.0]]]], dtype=torch.float64)  # (2, 1, 1, 2)
    torch.testing.assert_close(ours, expected, atol=0, rtol=0)


@pytest.mark.parametrize(
    "attn, padding, name",
    [
        (torch.zeros(L, S + 1, dtype=torch.bool), None, "attn_mask"),
        (torch.zeros(H, L, S, dtype=torch.bool), None, "attn_mask"),  # needs batch * H rows
        (torch.zeros(1, 1, L, S), None, "attn_mask"),
        (None, torch.zeros(N, S - 1, dtype=torch.bool), "key_padding_mask"),
        (None, torch.zeros(S, dtype=torch.bool), "key_padding_mask"),
        (torch.zeros(L, S, dtype=torch.int64), None, "attn_mask"),
    ],
)
def test_wrong_masks_raise_shape_error(attn, padding, name):
    with pytest.raises(ShapeError, match=name):
        torch_masks_to_ours(attn, padding, batch=N, n_heads=H, q_len=L, kv_len=S, dtype=torch.float32)
    ours = TorchStyleMultiheadAttention.from_torch(make_torch())
    with pytest.raises(ShapeError, match=name):
        ours(*inputs(torch.float32), attn_mask=attn, key_padding_mask=padding)


def test_mixed_batched_and_unbatched_inputs_raise_shape_error():
    q, k, v = inputs(torch.float32)
    with pytest.raises(ShapeError, match="unbatched"):
        TorchStyleMultiheadAttention.from_torch(make_torch())(q, k[:, 0], v[:, 0])


def test_fully_masked_row_gives_zeros_in_ours():
    mha = make_torch(torch.float64, batch_first=True)
    q, k, v = inputs(torch.float64, True)
    mask = torch.zeros(L, S, dtype=torch.bool)
    mask[2] = True  # torch convention: query 2 may see no key
    out, w = TorchStyleMultiheadAttention.from_torch(mha)(q, k, v, attn_mask=mask, average_attn_weights=False)
    torch.testing.assert_close(w[:, :, 2], torch.zeros(N, H, S, dtype=torch.float64), atol=0, rtol=0)
    # The heads' output is zero, so the row is just the output projection's bias.
    torch.testing.assert_close(out[:, 2], mha.out_proj.bias.expand(N, E), **TOL[torch.float64])
    assert torch.isfinite(out).all()
    assert torch.isnan(mha(q, k, v, attn_mask=mask)[0][:, 2]).all()  # torch: NaN


def test_grouped_query_inner_is_refused():
    with pytest.raises(ConfigError, match="grouped-query"):
        TorchStyleMultiheadAttention(MultiHeadAttention(E, H, n_kv_heads=1))


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    q_len=st.integers(1, 6),
    kv_len=st.integers(1, 6),
    heads=st.sampled_from([1, 2, 3]),
    batch_first=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_and_masks_match(batch, q_len, kv_len, heads, batch_first, seed):
    torch.manual_seed(seed)
    mha = nn.MultiheadAttention(4 * heads, heads, batch_first=batch_first, dtype=torch.float64).eval()
    width = mha.embed_dim
    q = torch.randn(batch, q_len, width, dtype=torch.float64)
    k = torch.randn(batch, kv_len, width, dtype=torch.float64)
    if not batch_first:
        q, k = q.transpose(0, 1), k.transpose(0, 1)
    attn = torch.rand(batch * heads, q_len, kv_len) < 0.5
    attn[..., 0] = False
    padding = torch.rand(batch, kv_len) < 0.5
    padding[:, 0] = False
    expected_out, expected_w = mha(q, k, k, attn_mask=attn, key_padding_mask=padding, average_attn_weights=False)
    out, w = TorchStyleMultiheadAttention.from_torch(mha)(
        q, k, k, attn_mask=attn, key_padding_mask=padding, average_attn_weights=False
    )
    torch.testing.assert_close(out, expected_out, **TOL[torch.float64])
    torch.testing.assert_close(w, expected_w, **TOL[torch.float64])
