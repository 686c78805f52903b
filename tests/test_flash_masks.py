"""flash_attention with structured, dense bool and float masks, against independent references.

- torch.nn.functional.scaled_dot_product_attention given the dense bool mask (written out by
  the loops of test_structured_masks) for outputs and d/dQ, d/dK, d/dV; a float64
  torch.logsumexp of the masked scores for lse. torch gives NaN on a row with no visible
  key, so such rows are opened for torch and compared against zeros;
- block skipping: the tiles count_tiles() records equal the non-EMPTY blocks found by a
  loop over the reference mask, and the mask is applied to PARTIAL tiles only;
- packed documents against each sequence attended on its own;
- GQA against torch's enable_gqa, with a recorder showing that K/V are never repeated.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import selfattn.kernels.flash as flash_module
from selfattn import scaled_dot_product_attention
from selfattn.errors import ShapeError
from selfattn.kernels.flash import BACKWARD_BLOCK_Q, flash_attention
from selfattn.kernels.flash_tiles import count_tiles
from selfattn.masks import EMPTY, FULL, PARTIAL, CausalMask, DenseMask, DocumentMask, PaddingMask, SlidingWindowMask
from test_structured_masks import document_loop, mask_cases, padding_loop, states_loop, window_loop

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def qkv(batch, hq, hk, q_len, kv_len, d=4, d_v=3, dtype=torch.float64, seed=0):
    return (
        randn(batch, hq, q_len, d, dtype=dtype, seed=seed),
        randn(batch, hk, kv_len, d, dtype=dtype, seed=seed + 1),
        randn(batch, hk, kv_len, d_v, dtype=dtype, seed=seed + 2),
    )


def grads_of(fn, tensors, upstream):
    """(output, lse or None, (dQ, dK, dV)) of fn on fresh leaves."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    result = fn(*leaves)
    output, lse = result if isinstance(result, tuple) else (result, None)
    return output.detach(), lse, torch.autograd.grad(output, leaves, upstream)


def torch_reference(tensors, bias, upstream, enable_gqa=False):
    """torch SDPA with a float bias (-inf = hidden); rows with no visible key are opened for torch
    and zeroed after, which also zeroes their gradients."""
    alive = (bias != float("-inf")).any(-1, keepdim=True)  # (..., q_len or 1, 1)
    opened = torch.where(alive, bias, torch.zeros_like(bias))

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=opened.to(q.dtype), enable_gqa=enable_gqa) * alive

    return grads_of(attend, tensors, upstream)


def as_bias(dense):
    return torch.zeros(dense.shape, dtype=torch.float64).masked_fill(~dense, float("-inf"))


def reference_lse(query, key, bias, group=1):
    """log sum_j exp(q_i . k_j / sqrt(d) + bias_ij) in float64."""
    key = key.double().repeat_interleave(group, dim=-3)
    scores = (query.double() @ key.transpose(-2, -1)) / query.shape[-1] ** 0.5 + bias
    return torch.logsumexp(scores, dim=-1)


def check_against_torch(tensors, mask, bias, dtype, enable_gqa=False, **blocks):
    """flash_attention(mask) against torch given ``bias``: output, lse, dQ, dK, dV."""
    q, k, v = tensors
    upstream = randn(*q.shape[:-1], v.shape[-1], dtype=dtype, seed=99)

    def flash(*t):
        return flash_attention(*t, attn_mask=mask, enable_gqa=enable_gqa, return_lse=True, **blocks)

    out, lse, grads = grads_of(flash, tensors, upstream)
    ref_out, _, ref_grads = torch_reference(tensors, bias, upstream, enable_gqa)
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    group = q.shape[-3] // k.shape[-3]
    ref_lse = reference_lse(q, k, bias, group).expand(lse.shape)
    torch.testing.assert_close(lse.double(), ref_lse, **TOL[dtype])
    for name, grad, ref in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(grad, ref, **TOL[dtype], msg=lambda m, name=name: f"d{name}: {m}")
    return out, lse


def inputs_for(lead, q_len, kv_len, dtype, seed=0):
    """q, k, v whose (batch, heads) fit a mask's leading axes (2 where the mask broadcasts)."""
    lead = (1, 1, *lead)[-2:]
    batch, heads = (size if size > 1 else 2 for size in lead)
    return qkv(batch, heads, heads, q_len, kv_len, dtype=dtype, seed=seed)


# Outputs, lse and gradients against torch.


@settings(max_examples=150, deadline=None)
@given(
    case=mask_cases(),
    block_q=st.integers(1, 11),
    block_k=st.integers(1, 11),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 100),
    big=st.booleans(),
)
def test_structured_masks_against_torch(case, block_q, block_k, dtype, seed, big):
    kind, mask, ref, q_len = case
    q, k, v = inputs_for(mask.lead, q_len, ref.shape[-1], dtype, seed)
    if big and dtype == torch.float64:  # scores in the hundreds: exp would overflow without a running max
        q = q * 500
    check_against_torch((q, k, v), mask, as_bias(ref), dtype, block_q=block_q, block_k=block_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "mask,ref",
    [
        (PaddingMask([0, 3], 5), padding_loop([0, 3], 5)),  # batch element 0 sees nothing
        (SlidingWindowMask(7, 3, left=1, align="bottom_right"), window_loop(7, 3, 1, 0, -4)),  # q_len > kv_len
        (CausalMask(6, 2, align="bottom_right"), window_loop(6, 2, None, 0, -4)),
        (DocumentMask([1, 2, 1], [1, 0, 2]), document_loop([1, 2, 1], [1, 0, 2])),  # doc 1 has no keys
        (DocumentMask([1, 1, 1, 1], [1, 1, 0, 1]), document_loop([1, 1, 1, 1], [1, 1, 0, 1])),  # single tokens
    ],
)
def test_rows_without_visible_keys_give_zeros_and_minus_inf(mask, ref, dtype):
    q_len = ref.shape[-2] if mask.q_len is not None else 4
    tensors = inputs_for(mask.lead, q_len, ref.shape[-1], dtype)
    out, lse = check_against_torch(tensors, mask, as_bias(ref), dtype, block_q=2, block_k=2)
    dead = ~ref.expand(*ref.shape[:-2], q_len, ref.shape[-1]).any(-1)
    assert dead.any()
    dead = dead.expand(lse.shape)
    assert torch.isneginf(lse[dead]).all() and not torch.isnan(lse).any()
    torch.testing.assert_close(out[dead], torch.zeros_like(out[dead]), atol=0, rtol=0)


@st.composite
def blocky_masks(draw, float_mask):
    """A mask built per 3x3 block: hidden, visible or random, so some blocks are entirely hidden."""
    q_len, kv_len = draw(st.integers(1, 10)), draw(st.integers(1, 10))
    shape = draw(st.sampled_from([(q_len, kv_len), (2, 1, q_len, kv_len), (2, 2, q_len, kv_len), (2, 1, 1, kv_len)]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    kinds = torch.randint(0, 3, (-(-shape[-2] // 3), -(-kv_len // 3)), generator=g)
    kinds = kinds.repeat_interleave(3, 0)[: shape[-2]].repeat_interleave(3, 1)[:, :kv_len]
    visible = torch.where(kinds == 2, torch.rand(shape, generator=g) < 0.6, kinds == 1)
    if not float_mask:
        return q_len, visible, as_bias(visible)
    values = 2 * torch.randn(shape, generator=g, dtype=torch.float64)
    values = torch.where(torch.rand(shape, generator=g) < 0.5, 0.0, values)
    bias = values.masked_fill(~visible, float("-inf"))
    return q_len, bias, bias


@settings(max_examples=80, deadline=None)
@given(
    drawn=st.one_of(blocky_masks(False), blocky_masks(True)),
    block_q=st.integers(1, 7),
    block_k=st.integers(1, 7),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    big=st.booleans(),
)
def test_dense_bool_and_float_masks_against_torch(drawn, block_q, block_k, dtype, big):
    q_len, mask, bias = drawn
    q, k, v = qkv(2, 2, 2, q_len, bias.shape[-1], dtype=dtype)
    if big and dtype == torch.float64:
        q = q * 500
    mask = mask if mask.dtype == torch.bool else mask.to(dtype)
    check_against_torch((q, k, v), mask, bias, dtype, block_q=block_q, block_k=block_k)


def float_mask_with_hidden_blocks():
    bias = randn(1, 1, 6, 7, seed=5)
    bias[..., :3, 4:] = float("-inf")  # whole blocks of 3 x 2 hidden...
    bias[..., 4, :] = float("-inf")  # ...and a row that sees nothing
    bias[..., 3:, :2] = 0.0  # blocks with nothing to add
    return bias


def test_float_mask_gradcheck_with_hidden_blocks():
    q, k, v = qkv(1, 2, 2, 6, 7, d=3, d_v=2, seed=4)
    tensors = [t.requires_grad_() for t in (q, k, v, float_mask_with_hidden_blocks())]
    assert torch.autograd.gradcheck(
        lambda q, k, v, m: flash_attention(q, k, v, attn_mask=m, block_q=3, block_k=2), tensors, atol=1e-8, rtol=1e-6
    )


def test_float_mask_gradient_against_torch():
    q, k, v = qkv(1, 2, 2, 6, 7, d=3, d_v=2, seed=4)
    bias = float_mask_with_hidden_blocks()
    upstream = randn(1, 2, 6, 2, seed=8)
    ours = torch.autograd.grad(
        flash_attention(q, k, v, attn_mask=bias.requires_grad_(), block_q=3, block_k=2), bias, upstream
    )[0]
    alive = (bias != float("-inf")).any(-1, keepdim=True)
    opened = torch.where(alive, bias, torch.zeros_like(bias)).detach().requires_grad_()
    theirs = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=opened) * alive, opened, upstream)[0]
    torch.testing.assert_close(ours, theirs * alive, **TOL[torch.float64])


# Skipping is real: exactly the tiles with something visible are computed.


def expected_tiles(visible, q_len, block_q, block_k):
    """("forward" | "backward", row start, key start) of every block with a visible pair, by a loop."""
    tiles = []
    for name, rows in (("forward", block_q), ("backward", min(block_q, BACKWARD_BLOCK_Q))):
        states = states_loop(visible, q_len, rows, block_k)
        tiles += [(name, i * rows, j * block_k) for i, j in (states != EMPTY).nonzero().tolist()]
    return sorted(tiles)


SKIP_CASES = {
    "window": (SlidingWindowMask(11, 11, left=2), window_loop(11, 11, 2, 0, 0)),
    "window_wide_rows": (SlidingWindowMask(70, 70, left=3, right=1), window_loop(70, 70, 3, 1, 0)),
    "documents": (DocumentMask([3, 1, 0, 5, 2]), document_loop([3, 1, 0, 5, 2])),
    "causal&window": (CausalMask(9, 12, align="bottom_right") & SlidingWindowMask(9, 12, left=3, align="bottom_right"),
                      window_loop(9, 12, 3, 0, 3)),
    "padding": (PaddingMask([2, 4], 11), padding_loop([2, 4], 11)),
    "dense_bool": (window_loop(10, 9, 1, 1, 0) | document_loop([2, 8], [7, 2]), None),
    "float": (as_bias(document_loop([4, 1, 5])) + torch.linspace(0, 1, 10), None),
}


@pytest.mark.parametrize("name", list(SKIP_CASES))
@pytest.mark.parametrize("block_q,block_k", [(2, 3), (3, 2), (100, 4)])
def test_count_tiles_equals_the_non_empty_blocks(name, block_q, block_k):
    mask, ref = SKIP_CASES[name]
    visible = ref if ref is not None else mask if mask.dtype == torch.bool else mask != float("-inf")
    q_len = visible.shape[-2] if visible.shape[-2] > 1 else 5
    tensors = inputs_for(getattr(mask, "lead", ()), q_len, visible.shape[-1], torch.float64)
    q, k, v = (t.requires_grad_() for t in tensors)
    with count_tiles() as tiles:
        out = flash_attention(q, k, v, attn_mask=mask, block_q=block_q, block_k=block_k)
        out.sum().backward()
    assert sorted(tiles) == expected_tiles(visible, q_len, block_q, block_k)
    n_cols = -(-visible.shape[-1] // block_k)
    all_tiles = (-(-q_len // block_q) + -(-q_len // min(block_q, BACKWARD_BLOCK_Q))) * n_cols  # forward and backward
    if (states_loop(visible, q_len, block_q, block_k) == EMPTY).any():
        assert len(tiles) < all_tiles
    bias = mask if name == "float" else as_bias(visible)
    ref_out = torch_reference((q, k, v), bias, torch.ones_like(out))[0]
    torch.testing.assert_close(out.detach(), ref_out, **TOL[torch.float64])


class StatedMask(DenseMask):
    """A DenseMask whose block states are given, true or not: what the kernel does with them shows."""

    def __init__(self, bits, states):
        super().__init__(bits)
        self.states = states

    def block_states(self, block_q, block_k, q_len=None):
        return self.states.clone()


def test_full_tiles_get_no_mask_and_empty_tiles_are_not_computed():
    """States that contradict the bits: a FULL block is seen whole, an EMPTY one not at all."""
    bits = torch.rand(6, 6, generator=torch.Generator().manual_seed(2)) < 0.5
    bits[:, 0] = True  # every row sees key 0
    states = torch.tensor([[PARTIAL, FULL, EMPTY], [FULL, EMPTY, PARTIAL], [PARTIAL, PARTIAL, FULL]], dtype=torch.int8)
    effective = bits.clone()
    for i, j in (states == FULL).nonzero().tolist():
        effective[2 * i:2 * i + 2, 2 * j:2 * j + 2] = True
    for i, j in (states == EMPTY).nonzero().tolist():
        effective[2 * i:2 * i + 2, 2 * j:2 * j + 2] = False
    assert not torch.equal(effective, bits)
    # small scores (the kernel may skip the running max) and, in float64, scores near 1000 (it may not)
    for dtype, scale in ((torch.float32, 1.0), (torch.float64, 1.0), (torch.float64, 500.0)):
        q, k, v = qkv(2, 2, 2, 6, 6, dtype=dtype, seed=int(scale))
        mask = StatedMask(bits, states)
        check_against_torch((q * scale, k, v), mask, as_bias(effective), dtype, block_q=2, block_k=2)


# Packed sequences: one call over a packed batch equals each sequence on its own.


@pytest.mark.parametrize(
    "lengths,kv_lengths,causal",
    [
        ([3, 1, 5, 2], None, False),
        ([3, 1, 5, 2], None, True),
        ([2, 1, 3], [4, 1, 2], False),
        ([2, 0, 1], [1, 2, 3], False),
    ],
)
def test_packed_documents_equal_separate_sequences(lengths, kv_lengths, causal):
    """One call over the packing (a length-1 document, keys without queries) against torch per document."""
    kv_lengths = kv_lengths or lengths
    q, k, v = qkv(1, 2, 2, sum(lengths), sum(kv_lengths), seed=3)
    mask = DocumentMask(lengths, kv_lengths)
    if causal:
        mask = mask & CausalMask(sum(lengths))  # with equal lengths: each document's own causal rule
    upstream = randn(1, 2, sum(lengths), 3, seed=6)
    out, _, grads = grads_of(lambda *t: flash_attention(*t, attn_mask=mask, block_q=2, block_k=3), (q, k, v), upstream)

    parts = []
    for n, n_kv, q_i, k_i, v_i, up_i in zip(lengths, kv_lengths, q.split(lengths, -2), k.split(kv_lengths, -2),
                                            v.split(kv_lengths, -2), upstream.split(lengths, -2)):
        own = torch.ones(n, n_kv, dtype=torch.bool)
        o, _, g = torch_reference((q_i, k_i, v_i), as_bias(own.tril() if causal else own), up_i)
        parts.append((o, *g))
    for name, actual, pieces in zip(["output", "dq", "dk", "dv"], (out, *grads), zip(*parts)):
        expected = torch.cat(pieces, -2)
        torch.testing.assert_close(actual, expected, **TOL[torch.float64], msg=lambda m, name=name: f"{name}: {m}")


# GQA: the G query heads of a group share the K/V tile; nothing of size Hq x kv_len x d is made.


class ShapeRecorder(TorchDispatchMode):
    """Notes the shape of every tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        self.shapes += [tuple(t.shape) for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        return result


def gqa_mask(kind, batch, hq, q_len, kv_len):
    """(mask for flash, the same mask as a float64 bias for torch)."""
    g = torch.Generator().manual_seed(1)
    if kind == "none":
        return None, torch.zeros(q_len, kv_len, dtype=torch.float64)
    if kind == "causal&window":
        return (CausalMask(q_len, kv_len, align="bottom_right")
                & SlidingWindowMask(q_len, kv_len, left=2, align="bottom_right"),
                as_bias(window_loop(q_len, kv_len, 2, 0, kv_len - q_len)))
    if kind == "documents":
        return DocumentMask([2, 0, 1, 2], [3, 1, 0, 3]), as_bias(document_loop([2, 0, 1, 2], [3, 1, 0, 3]))
    if kind == "padding":
        return PaddingMask([7, 3], kv_len), as_bias(padding_loop([7, 3], kv_len))
    if kind == "float":  # one per batch element, shared by the heads; a hidden 2 x 3 block
        bias = randn(batch, 1, q_len, kv_len, seed=3)
        bias[..., :2, 3:6] = float("-inf")
        return bias, bias
    heads = {"dense": (), "dense_batch": (batch, 1), "per_head": (batch, hq), "per_head_structured": (batch, hq)}[kind]
    bits = torch.rand(*heads, q_len, kv_len, generator=g) < 0.6
    if kind == "per_head_structured":  # a rule joined with a per-head tensor: still one mask per query head
        return DenseMask(bits) & CausalMask(q_len, kv_len), as_bias(bits & window_loop(q_len, kv_len, None, 0, 0))
    return bits, as_bias(bits)


GQA_KINDS = ["none", "causal&window", "documents", "padding", "float", "dense", "dense_batch", "per_head",
             "per_head_structured"]


@pytest.mark.parametrize("hq,hk", [(4, 1), (2, 1), (8, 2)])
@pytest.mark.parametrize("kind", GQA_KINDS)
def test_gqa_against_torch_without_repeating_kv(hq, hk, kind, monkeypatch):
    batch, q_len, kv_len, d = 2, 5, 7, 3
    q, k, v = qkv(batch, hq, hk, q_len, kv_len, d=d, d_v=d, seed=hq + hk)
    mask, bias = gqa_mask(kind, batch, hq, q_len, kv_len)
    expand_calls = []
    real_expand = flash_module.expand_kv_heads
    monkeypatch.setattr(flash_module, "expand_kv_heads", lambda *a: expand_calls.append(a) or real_expand(*a))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    upstream = randn(batch, hq, q_len, d, seed=7)
    with ShapeRecorder() as recorder:
        out = flash_attention(*leaves, attn_mask=mask, enable_gqa=True, block_q=2, block_k=3)
        out.backward(upstream)
    # K or V repeated for the query heads, in any layout: more than batch x Hk rows of (kv_len, d)
    repeated = [s for s in recorder.shapes if s[-2:] == (kv_len, d) and torch.Size(s).numel() > batch * hk * kv_len * d]
    per_head = kind.startswith("per_head")  # the fallback: the recorder must see the copies there
    assert bool(expand_calls) == per_head and bool(repeated) == per_head, (expand_calls, repeated)

    ref_out, _, ref_grads = torch_reference((q, k, v), bias, upstream, enable_gqa=True)
    torch.testing.assert_close(out.detach(), ref_out, **TOL[torch.float64])
    for grad, ref in zip((t.grad for t in leaves), ref_grads):
        torch.testing.assert_close(grad, ref, **TOL[torch.float64])


def test_gqa_float_mask_gradient_sums_over_the_heads():
    q, k, v = qkv(2, 4, 1, 5, 7, d=3, d_v=3, seed=2)
    bias, _ = gqa_mask("float", 2, 4, 5, 7)
    upstream = randn(2, 4, 5, 3, seed=4)
    mask = bias.clone().requires_grad_()
    ours = torch.autograd.grad(flash_attention(q, k, v, attn_mask=mask, enable_gqa=True, block_q=2, block_k=3), mask,
                               upstream)[0]
    mask = bias.clone().requires_grad_()  # every row sees a key: torch needs no opening
    theirs = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), mask,
                                 upstream)[0]
    torch.testing.assert_close(ours, theirs, **TOL[torch.float64])


# The reference scaled_dot_product_attention takes structured masks as their dense form.


@settings(max_examples=25, deadline=None)
@given(case=mask_cases())
def test_reference_attention_with_structured_masks_equals_dense(case):
    kind, mask, ref, q_len = case
    tensors = inputs_for(mask.lead, q_len, ref.shape[-1], torch.float64, seed=2)
    upstream = randn(*tensors[0].shape[:-1], 3, seed=5)
    out, _, grads = grads_of(lambda *t: scaled_dot_product_attention(*t, attn_mask=mask), tensors, upstream)
    dense_out, _, dense_grads = grads_of(lambda *t: scaled_dot_product_attention(*t, attn_mask=ref), tensors, upstream)
    torch.testing.assert_close(out, dense_out, atol=0, rtol=0, equal_nan=True)
    for grad, dense_grad in zip(grads, dense_grads):
        torch.testing.assert_close(grad, dense_grad, atol=0, rtol=0, equal_nan=True)


# Shape errors.


@pytest.mark.parametrize(
    "attend,words",
    [(flash_attention, "the mask is for q_len x kv_len = "),
     (scaled_dot_product_attention, "does not broadcast to the scores")],
)
@pytest.mark.parametrize("mask", [CausalMask(4, 5), DocumentMask([2, 2]), SlidingWindowMask(3, 6, left=1)])
def test_masks_for_other_lengths_raise_shape_error(attend, words, mask):
    q, k, v = qkv(2, 2, 2, 4, 6)
    with pytest.raises(ShapeError, match=words):
        attend(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("attend", [flash_attention, scaled_dot_product_attention])
def test_padding_mask_for_another_batch_raises_shape_error(attend):
    q, k, v = qkv(2, 2, 2, 4, 6)
    with pytest.raises(ShapeError, match="broadcast"):
        attend(q, k, v, attn_mask=PaddingMask([1, 2, 3], 6))  # batch 3 against batch 2


def test_padding_mask_wider_than_a_batch_of_one_raises_shape_error():
    q, k, v = qkv(1, 2, 2, 4, 4)
    with pytest.raises(ShapeError, match="broadcast"):
        flash_attention(q, k, v, attn_mask=PaddingMask([1, 2, 3], 4))


def test_float16_gradients_with_a_hidden_key_far_above_the_visible_one():
    q, k = torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4)
    q[..., 0, 0], q[..., 1, 1] = 30.0, 1.0
    k[..., 0, 1], k[..., 1, 0] = 1.0, 1.0  # row 0: visible key 0 scores 0, hidden key 1 scores 15
    v = randn(1, 1, 2, 4, dtype=torch.float32)
    upstream = randn(1, 1, 2, 4, dtype=torch.float32, seed=1)
    half = [t.half() for t in (q, k, v)]
    _, _, grads = grads_of(lambda *t: flash_attention(*t, attn_mask=CausalMask(2), block_q=2, block_k=2), half,
                           upstream.half())
    _, _, ref_grads = torch_reference([t.float() for t in half], as_bias(window_loop(2, 2, None, 0, 0)), upstream)
    for grad, ref in zip(grads, ref_grads):
        torch.testing.assert_close(grad.float(), ref, atol=1e-2, rtol=1e-2)
