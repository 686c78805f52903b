"""flex_attention, create_block_mask and the mask combinators against torch's own FlexAttention.

torch's flex_attention runs eagerly on the CPU (forward only: it has no CPU backward), so
outputs and lse are compared with it, on the same score_mod and mask_mod. Gradients are
compared with autograd through a dense reference written here (scores, bias, mask,
softmax), and with float64 gradcheck.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import selfattn as sa
from selfattn.kernels.flash_tiles import count_tiles

flex_module = pytest.importorskip("torch.nn.attention.flex_attention")
NEG_INF = float("-inf")


def torch_flex(q, k, v, score_mod=None, mask_mod=None, batch=None, heads=None, block=8, **options):
    block_mask = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that eager flex attention is slow
        if mask_mod is not None:
            block_mask = flex_module.create_block_mask(mask_mod, batch, heads, q.shape[-2], k.shape[-2], device="cpu",
                                                       BLOCK_SIZE=block)
        return flex_module.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, return_lse=True, **options)


def ours(q, k, v, score_mod=None, mask_mod=None, batch=None, heads=None, block=8, **options):
    block_mask = None if mask_mod is None else sa.create_block_mask(mask_mod, batch, heads, q.shape[-2], k.shape[-2],
                                                                     BLOCK_SIZE=block)
    return sa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, return_lse=True, **options)


def inputs(b=2, hq=3, hk=3, q_len=37, kv_len=29, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, q_len, d, generator=g, dtype=dtype), torch.randn(b, hk, kv_len, d, generator=g, dtype=dtype),
            torch.randn(b, hk, kv_len, d, generator=g, dtype=dtype))


SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64)
TABLE = torch.randn(128, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
SCORE_MODS = {
    "none": None,
    "alibi": lambda s, b, h, q, kv: s + SLOPES[h] * (kv - q),
    "softcap": lambda s, b, h, q, kv: 4 * torch.tanh(s / 4),
    "relative": lambda s, b, h, q, kv: s + TABLE[q - kv + 64],
    "per-batch": lambda s, b, h, q, kv: s * (1 + b) - h,
}
MASK_MODS = {
    "none": None,
    "causal": lambda b, h, q, kv: q >= kv,
    "window": lambda b, h, q, kv: (q - kv).abs() <= 4,
    "documents": lambda b, h, q, kv: (q // 10) == (kv // 10),
    "prefix-lm": lambda b, h, q, kv: (kv < 6) | (q >= kv),
    "per-head": lambda b, h, q, kv: (kv + h) % 3 != 0,
    "none-visible-late": lambda b, h, q, kv: kv < 0 + q - 20,  # early rows see nothing
}


@pytest.mark.parametrize("mask_name", MASK_MODS)
@pytest.mark.parametrize("mod_name", SCORE_MODS)
def test_outputs_and_lse_equal_torch_flex_attention(mod_name, mask_name):
    q, k, v = inputs()
    heads = 3 if mask_name == "per-head" else None
    mine, lse = ours(q, k, v, SCORE_MODS[mod_name], MASK_MODS[mask_name], heads=heads)
    theirs, their_lse = torch_flex(q, k, v, SCORE_MODS[mod_name], MASK_MODS[mask_name], heads=heads)
    torch.testing.assert_close(mine, theirs, atol=1e-12, rtol=1e-12)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(their_lse))  # rows that see nothing: lse = -inf, zeros
    torch.testing.assert_close(lse.nan_to_num(neginf=0.0), their_lse.to(lse.dtype).nan_to_num(neginf=0.0), atol=1e-12,
                               rtol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    q_len=st.integers(1, 40), kv_len=st.integers(1, 40), block=st.sampled_from([4, 8, 16]),
    mod=st.sampled_from(sorted(SCORE_MODS)), masks=st.lists(st.sampled_from(sorted(MASK_MODS)[:-1]), max_size=3),
    join=st.sampled_from(["and", "or"]), gqa=st.booleans(), seed=st.integers(0, 1000),
)
def test_random_combinations_equal_torch(q_len, kv_len, block, mod, masks, join, gqa, seed):
    q, k, v = inputs(1, 4, 2 if gqa else 4, q_len, kv_len, 8, seed=seed)
    mods = [MASK_MODS[m] for m in masks if MASK_MODS[m] is not None]
    mask_mod = None if not mods else (sa.and_masks if join == "and" else sa.or_masks)(*mods)
    their_join = flex_module.and_masks if join == "and" else flex_module.or_masks
    their_mask = None if not mods else their_join(*mods)
    heads = 4 if "per-head" in masks else None
    mine, lse = ours(q, k, v, SCORE_MODS[mod], mask_mod, heads=heads, block=block, enable_gqa=gqa)
    theirs, their_lse = torch_flex(q, k, v, SCORE_MODS[mod], their_mask, heads=heads, block=block, enable_gqa=gqa)
    torch.testing.assert_close(mine, theirs, atol=1e-12, rtol=1e-12)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(their_lse))


def dense_reference(q, k, v, score_mod, mask_mod, scale=None):
    """The same attention written out on the whole score matrix, for autograd."""
    b = torch.arange(q.shape[0]).view(-1, 1, 1, 1)
    h = torch.arange(q.shape[1]).view(1, -1, 1, 1)
    i = torch.arange(q.shape[2]).view(1, 1, -1, 1)
    j = torch.arange(k.shape[2]).view(1, 1, 1, -1)
    scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if score_mod is not None:
        scores = score_mod(scores, b, h, i, j)
    if mask_mod is not None:
        scores = scores.masked_fill(~mask_mod(b, h, i, j).expand(scores.shape), NEG_INF)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see nothing give 0
    return weights @ v


@pytest.mark.parametrize("mask_name", ["none", "causal", "window", "none-visible-late"])
def test_gradients_equal_autograd_through_a_dense_reference(mask_name):
    table = torch.randn(80, dtype=torch.float64, requires_grad=True)  # a learnable relative bias, captured

    def relative(s, b, h, q, kv):
        return s + table[q - kv + 40]

    mask_mod = MASK_MODS[mask_name]
    q, k, v = (t.requires_grad_() for t in inputs(2, 3, 3, 31, 23, 8))
    out = sa.flex_attention(q, k, v, score_mod=relative, block_mask=None if mask_mod is None else
                            sa.create_block_mask(mask_mod, None, None, 31, 23, BLOCK_SIZE=8))
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, table), grad)
    expected = torch.autograd.grad(dense_reference(q, k, v, relative, mask_mod), (q, k, v, table), grad)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-11)


ADDS_A_BIAS = {  # score_mod -> whether it is score + something independent of the score (the backward's fast path)
    "alibi": True, "relative": True, "softcap": False, "per-batch": False,
    "nested": True, "bias first": True, "identity": True, "a subtracted bias": True,
    "score subtracted": False, "alpha 2": False, "where": False, "scaled": False, "softcap of alibi": False,
    "float32 bias on float64": True, "float64 bias on float32": False, "in place on a clone": True,
    "a view scaled in place": False, "an item set": False, "a view of the score scaled": False,
}
FORMS = {
    **{name: SCORE_MODS[name] for name in ("alibi", "relative", "softcap", "per-batch")},
    "nested": lambda s, b, h, q, kv: (s + TABLE[q - kv + 64]) - SLOPES[h] * (q - kv),
    "bias first": lambda s, b, h, q, kv: TABLE[q - kv + 64] + s,
    "identity": lambda s, b, h, q, kv: s,
    "a subtracted bias": lambda s, b, h, q, kv: torch.sub(s, SLOPES[h]),
    "score subtracted": lambda s, b, h, q, kv: 1.0 - s,
    "alpha 2": lambda s, b, h, q, kv: torch.add(TABLE[q - kv + 64], s, alpha=2),
    "where": lambda s, b, h, q, kv: torch.where(q >= kv, s, -5.0),
    "scaled": lambda s, b, h, q, kv: s * 2.0,
    "softcap of alibi": lambda s, b, h, q, kv: 4 * torch.tanh((s + SLOPES[h] * (kv - q)) / 4),
    "float32 bias on float64": lambda s, b, h, q, kv: s + TABLE.float()[q - kv + 64],
    "float64 bias on float32": lambda s, b, h, q, kv: s + TABLE[q - kv + 64],
    "in place on a clone": lambda s, b, h, q, kv: s.clone().add_(SLOPES[h]),
    "a view scaled in place": lambda s, b, h, q, kv: _scaled_through_a_view(s + SLOPES[h]),
    "an item set": lambda s, b, h, q, kv: _first_key_set(s + SLOPES[h]),
    "a view of the score scaled": lambda s, b, h, q, kv: _view_scaled_then_returned(s.clone()),
}


def _scaled_through_a_view(t):
    t[..., :1].mul_(2.0)  # the first key's scores doubled, through a view: not a bias
    return t


def _first_key_set(t):
    t[..., 0] = -1.0  # the first key's scores replaced: not a bias
    return t


def _view_scaled_then_returned(t):
    t.view(-1).mul_(0.5)  # the tensor itself halved through a view, then returned
    return t


@pytest.mark.parametrize("name", sorted(ADDS_A_BIAS))
def test_which_score_mods_add_a_bias(name):
    from selfattn.kernels.score_mod_form import adds_a_bias
    from selfattn.masks.block_mask import mask_indices

    dtype = torch.float32 if name == "float64 bias on float32" else torch.float64
    assert adds_a_bias(FORMS[name], *mask_indices(2, 4), dtype) is ADDS_A_BIAS[name]


@pytest.mark.parametrize("name", sorted(ADDS_A_BIAS))
@pytest.mark.parametrize("mask_name", ["none", "causal"])
def test_gradients_of_every_score_mod_form_equal_the_dense_reference(name, mask_name):
    """Both backward paths (a bias passes dS on; anything else runs autograd per tile) against autograd on the whole matrix."""
    dtype = torch.float32 if name == "float64 bias on float32" else torch.float64
    q, k, v = (t.to(dtype).requires_grad_() for t in inputs(2, 4, 4, 21, 21, 8))
    mod, mask_mod = FORMS[name], MASK_MODS[mask_name]
    block_mask = None if mask_mod is None else sa.create_block_mask(mask_mod, None, None, 21, 21, BLOCK_SIZE=8)
    out = sa.flex_attention(q, k, v, score_mod=mod, block_mask=block_mask)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    expected = torch.autograd.grad(dense_reference(q, k, v, lambda *a: mod(*a).to(dtype), mask_mod), (q, k, v), grad)
    tolerance = 1e-4 if dtype == torch.float32 else 1e-11
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=tolerance, rtol=tolerance)


def test_a_bias_without_learnable_tensors_needs_no_autograd_in_the_backward(monkeypatch):
    """The fast path is taken: no autograd.grad call per tile for ALiBi; one per tile for a softcap."""
    calls = []
    real = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for name in ("alibi", "softcap"):
        calls.clear()
        q, k, v = (t.requires_grad_() for t in inputs(1, 4, 4, 300, 300, 8))
        sa.flex_attention(q, k, v, score_mod=SCORE_MODS[name]).sum().backward()
        assert (len(calls) == 0) if name == "alibi" else (len(calls) >= 3), (name, len(calls))  # 300 rows: 3 row blocks


def test_gradcheck_in_float64_with_a_captured_bias_and_gqa():
    causal = sa.create_block_mask(MASK_MODS["causal"], None, None, 9, 9, BLOCK_SIZE=4)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 9, 4, dtype=torch.float64, generator=g, requires_grad=True)
    k, v = (torch.randn(1, 2, 9, 4, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(2))
    bias = torch.randn(20, dtype=torch.float64, generator=g, requires_grad=True)

    def run(q, k, v, bias):
        return sa.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + bias[i - j + 9] * (h + 1),
                                 block_mask=causal, enable_gqa=True)

    assert torch.autograd.gradcheck(run, (q, k, v, bias))


def test_a_relative_bias_table_trains():
    """The captured table gets its gradient through the kernel's backward, and an optimiser step moves it."""
    table = torch.nn.Parameter(torch.zeros(64, dtype=torch.float64))
    q, k, v = inputs(1, 2, 2, 16, 16, 8)
    target = dense_reference(q, k, v, lambda s, b, h, i, j: s + 2.0 * (i == j), None)  # attention that likes itself
    optimiser = torch.optim.Adam([table], lr=0.1)
    losses = []
    for _ in range(60):
        optimiser.zero_grad()
        out = sa.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + table[i - j + 32])
        loss = ((out - target) ** 2).mean()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
    assert table[32].item() > 0.5  # the diagonal's bias grew, as the target asks


def test_empty_blocks_are_never_computed():
    q, k, v = inputs(1, 1, 1, 1024, 1024, 8, dtype=torch.float32)
    documents = sa.create_block_mask(lambda b, h, i, j: (i // 256) == (j // 256), None, None, 1024, 1024)
    with count_tiles() as tiles:
        sa.flex_attention(q, k, v, score_mod=SCORE_MODS["softcap"], block_mask=documents)
    forward = [(r0, c0) for kind, r0, c0 in tiles if kind == "forward"]
    assert forward and all(r0 // 256 == c0 // 256 for r0, c0 in forward)  # only tiles inside a document
    rows = sorted({r0 for r0, _ in forward})
    block = rows[1] - rows[0]
    assert len(forward) == (1024 // block) * max(1, 256 // block)  # the diagonal blocks, none of the rest


def test_block_masks_and_structured_masks_interchange():
    q, k, v = inputs(2, 4, 2, 33, 40, 8)
    window = sa.sliding_window_mask(33, 40, left=5, structured=True)
    expected = sa.scaled_dot_product_attention(q, k, v, attn_mask=window.dense(), enable_gqa=True)
    torch.testing.assert_close(sa.flex_attention(q, k, v, block_mask=window, enable_gqa=True), expected)
    mask = sa.create_block_mask(MASK_MODS["per-head"], None, 4, 33, 40, BLOCK_SIZE=16)
    dense = mask.to_dense()
    assert dense.shape == (1, 4, 33, 40)
    expected = sa.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True)
    torch.testing.assert_close(sa.flash_attention(q, k, v, attn_mask=mask, enable_gqa=True), expected)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        their_mask = flex_module.create_block_mask(MASK_MODS["per-head"], None, 4, 33, 40, device="cpu", BLOCK_SIZE=16)
    torch.testing.assert_close(sa.flex_attention(q, k, v, block_mask=their_mask, enable_gqa=True), expected)


def test_the_block_map_matches_the_mask_mod_pair_by_pair():
    for name in ("causal", "window", "documents", "prefix-lm", "per-head"):
        heads = 3 if name == "per-head" else None
        mask = sa.create_block_mask(MASK_MODS[name], 2, heads, 45, 38, BLOCK_SIZE=(8, 16))
        pairs = MASK_MODS[name](torch.arange(2).view(-1, 1, 1, 1), torch.arange(heads or 1).view(1, -1, 1, 1),
                                torch.arange(45).view(1, 1, -1, 1), torch.arange(38).view(1, 1, 1, -1))
        pairs = pairs.expand(2, heads or 1, 45, 38)
        assert torch.equal(mask.to_dense().expand_as(pairs), pairs)
        states = mask.states
        for r in range(states.shape[0]):
            for c in range(states.shape[1]):
                block = pairs[..., r * 8:(r + 1) * 8, c * 16:(c + 1) * 16]
                expected = 0 if not block.any() else 1 if block.all() else 2
                assert int(states[r, c]) == expected
        assert torch.equal(mask.block_states(16, 32), sa.create_block_mask(MASK_MODS[name], 2, heads, 45, 38, 16).block_states(16, 32))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q, k, v: sa.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s > 0), "floating-point"),
        (lambda q, k, v: sa.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s[..., :2]), "does not broadcast"),
        (lambda q, k, v: sa.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s.sum()), "element by element"),
        (lambda q, k, v: sa.flex_attention(q, k, v, score_mod=3), "score_mod must be a function"),
        (lambda q, k, v: sa.create_block_mask(lambda b, h, i, j: i - j, None, None, 9, 9), "torch.bool"),
        (lambda q, k, v: sa.flex_attention(q, k, v, block_mask=sa.create_block_mask(MASK_MODS["causal"], None, None, 8, 9)),
         "Q_LEN x KV_LEN = 8 x 9"),
        (lambda q, k, v: sa.flex_attention(q, k, v, block_mask=sa.create_block_mask(MASK_MODS["causal"], 3, None, 9, 9)),
         "B, H"),
        (lambda q, k, v: sa.flex_attention(q, k, v, block_mask="causal"), "block_mask must be"),
        (lambda q, k, v: sa.flex_attention(q[0], k[0], v[0]), "(batch, heads, seq, d)"),
        (lambda q, k, v: sa.create_block_mask(MASK_MODS["causal"], None, None, 0, 9), "Q_LEN"),
        (lambda q, k, v: sa.create_block_mask(MASK_MODS["causal"], None, None, 9, 9, BLOCK_SIZE=(8, 0)), "BLOCK_SIZE"),
    ],
)
def test_bad_input_is_a_typed_one_line_error(call, message):
    q, k, v = inputs(2, 2, 2, 9, 9, 4)
    with pytest.raises(sa.SelfAttnError) as caught:
        call(q, k, v)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("form", ["alibi", "alibi + table", "softcap of alibi"])
def test_captured_tensors_get_their_gradients_on_both_paths(form):
    """Learnable slopes and tables: through the bias path (autograd on the bias alone) and the general one
    (a softcap around the bias), against autograd through the dense reference, float64."""
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64, requires_grad=True)
    table = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    mods = {
        "alibi": lambda s, b, h, q, kv: s + slopes[h] * (kv - q),
        "alibi + table": lambda s, b, h, q, kv: s + slopes[h] * (kv - q) + table[q - kv + 32],
        "softcap of alibi": lambda s, b, h, q, kv: 5 * torch.tanh((s + slopes[h] * (kv - q)) / 5),
    }
    mod = mods[form]
    sources = [slopes, table] if form == "alibi + table" else [slopes]
    q, k, v = (t.requires_grad_() for t in inputs(2, 4, 4, 29, 29, 8))
    causal = sa.create_block_mask(MASK_MODS["causal"], None, None, 29, 29, BLOCK_SIZE=8)
    out = sa.flex_attention(q, k, v, score_mod=mod, block_mask=causal)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, *sources), grad)
    expected = torch.autograd.grad(dense_reference(q, k, v, mod, MASK_MODS["causal"]), (q, k, v, *sources), grad)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-11)
