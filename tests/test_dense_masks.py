"""Dense bool and float masks in the kernel: block states reduced once, float masks added with their -inf.

References: torch's own scaled_dot_product_attention (outputs and gradients, the mask's
gradient included) and the block states of the dense mask reduced block by block in the test.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import selfattn as sa
from selfattn.kernels.flash_tiles import FloatMask, count_tiles
from selfattn.masks.dense_states import DenseStates
from selfattn.masks.states import EMPTY, FULL, PARTIAL


def reduced_by_loop(mask: torch.Tensor, block_q: int, block_k: int) -> torch.Tensor:
    """EMPTY / FULL / PARTIAL of each block over every leading axis, block by block."""
    rows, cols = mask.shape[-2:]
    flat = mask.reshape(-1, rows, cols)
    out = torch.empty(-(-rows // block_q), -(-cols // block_k), dtype=torch.int8)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            block = flat[:, i * block_q:(i + 1) * block_q, j * block_k:(j + 1) * block_k]
            visible = block if block.dtype == torch.bool else block != float("-inf")
            untouched = block if block.dtype == torch.bool else block == 0
            out[i, j] = EMPTY if not visible.any() else FULL if untouched.all() else PARTIAL
    return out


def structured_float(heads: int, n: int, m: int, seed: int = 0) -> torch.Tensor:
    """A float mask with empty, full and partial blocks: a band of small biases, -inf outside, zeros in a corner."""
    g = torch.Generator().manual_seed(seed)
    i, j = torch.arange(n)[:, None], torch.arange(m)[None, :]
    mask = torch.randn(heads, n, m, generator=g, dtype=torch.float64).masked_fill((i - j).abs() > 150, float("-inf"))
    mask[:, :128, :128] = 0.0
    return mask


@pytest.mark.parametrize("blocks", [(64, 128), (128, 128), (256, 512), (512, 256), (64, 512), (40, 100), (512, 512)])
@pytest.mark.parametrize("kind", ["bool window", "float", "float with one head"])
def test_states_read_off_the_base_map_equal_the_direct_reduction(blocks, kind):
    if kind == "bool window":
        mask = sa.sliding_window_mask(640, 768, left=100, right=37)
    else:
        mask = structured_float(3 if kind == "float" else 1, 640, 768)
    states = DenseStates(mask)
    for _ in range(2):  # the second call reads its cache
        torch.testing.assert_close(states.states(*blocks, 640), reduced_by_loop(mask, *blocks), atol=0, rtol=0)


def test_float_states_find_the_extent_and_expanded_masks_take_the_exact_reduction():
    mask = structured_float(2, 256, 256)
    float_mask = FloatMask(mask)
    float_mask.block_states(128, 128, 256)
    finite = mask[torch.isfinite(mask)]
    assert float_mask.extent == (float("-inf"), float(finite.max())) and float_mask.hides
    assert float_mask.largest_bias() == max(abs(float(finite.min())), abs(float(finite.max())))  # the finite entries
    expanded = mask[:1].expand(4, 256, 256)  # a view that cannot be reshaped into blocks
    torch.testing.assert_close(DenseStates(expanded).states(128, 128, 256), reduced_by_loop(expanded, 128, 128),
                               atol=0, rtol=0)
    small = FloatMask(torch.full((256, 256), -2.5))
    assert not small.hides and small.largest_bias() == 2.5


def test_the_finite_extent_of_a_hiding_mask_reads_only_the_blocks_its_edge_crosses():
    """A causal float mask with values: its finite (min, max) exactly, whichever block holds them; a large
    mask without structure (every block mixes -inf and numbers) says infinite instead."""
    g = torch.Generator().manual_seed(3)
    i, j = torch.arange(512)[:, None], torch.arange(512)[None, :]
    values = torch.rand(2, 512, 512, generator=g, dtype=torch.float64) * 4 - 2
    values[1, 300, 299] = -7.5  # the lowest finite entry, in a block the diagonal crosses
    causal = values.masked_fill(j > i, float("-inf"))
    assert FloatMask(causal).largest_bias() == 7.5
    assert DenseStates(causal).finite_extent() == (-7.5, float(causal[torch.isfinite(causal)].max()))
    scattered = values.masked_fill(torch.rand(512, 512, generator=g) < 0.5, float("-inf"))  # 32 mixed blocks: read
    assert FloatMask(scattered).largest_bias() == float(scattered[torch.isfinite(scattered)].abs().max())
    wide = torch.zeros(4096, 4096).masked_fill(torch.rand(4096, 4096, generator=g) < 0.5, float("-inf"))
    assert math.isinf(FloatMask(wide).largest_bias())  # 2048 mixed blocks: another pass would cost too much
    first = causal[:1]
    assert FloatMask(first.expand(3, 512, 512)).largest_bias() == float(first[torch.isfinite(first)].abs().max())
    assert math.isinf(FloatMask(torch.full((256, 256), float("-inf"))).largest_bias())  # nothing visible


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", ["float band", "alibi", "causal + alibi", "bool window", "all zero"])
def test_dense_masks_against_torch_with_gradients(case, dtype):
    n, heads = 384, 2
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, heads, n, 32, generator=g, dtype=dtype) * 2
    k, v = (torch.randn(1, heads, n, 32, generator=g, dtype=dtype) for _ in range(2))
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    slopes = torch.tensor([0.5, 0.0625], dtype=dtype)[:, None, None]
    mask = {
        "float band": structured_float(heads, n, n).to(dtype),
        "alibi": -slopes * (i - j).abs(),
        "causal + alibi": (-slopes * (i - j)).masked_fill(j > i, float("-inf")),
        "bool window": (i - j).abs() <= 100,
        "all zero": torch.zeros(n, n, dtype=dtype),
    }[case]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    float_mask = not mask.dtype == torch.bool
    if float_mask:
        mask, ref_mask = mask.clone().requires_grad_(), mask.clone().requires_grad_()
    else:
        ref_mask = mask
    with count_tiles() as tiles:
        out = sa.flash_attention(*leaves, attn_mask=mask)
    expected = F.scaled_dot_product_attention(*refs, attn_mask=ref_mask)
    grad_out = torch.randn(out.shape, generator=g, dtype=dtype)
    out.backward(grad_out)
    expected.backward(grad_out)
    tol = dict(atol=1e-10, rtol=1e-9) if dtype == torch.float64 else dict(atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(out, expected, **tol)
    for a, b in zip(leaves, refs):
        torch.testing.assert_close(a.grad, b.grad, **tol)
    if float_mask:
        torch.testing.assert_close(mask.grad, ref_mask.grad, **tol)
    if case in ("float band", "bool window"):  # blocks far from the band were skipped
        assert len([t for t in tiles if t[0] == "forward"]) < 9


def test_scaled_dot_product_attention_takes_the_kernel_for_large_masked_calls():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=g) for _ in range(3))
    window = sa.sliding_window_mask(300, left=40, right=40)
    with count_tiles() as tiles:
        out = sa.scaled_dot_product_attention(q, k, v, attn_mask=window)
    assert tiles, "300 x 300 with a bool mask runs on the kernel"
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=window), atol=2e-6, rtol=1e-5)
    with count_tiles() as tiles:
        sa.scaled_dot_product_attention(q[..., :20, :], k[..., :20, :], v[..., :20, :], attn_mask=window[:20, :20])
    assert not tiles, "a small call keeps the plain steps"


@pytest.mark.parametrize("window", [(None, 0), (5, 2), (0, None), (3, 3)])
@pytest.mark.parametrize("blocks", [(4, 8), (16, 16), (64, 128)])
def test_packed_window_states_never_claim_too_much(window, blocks):
    from selfattn.masks import DocumentMask
    from selfattn.masks.packed import PackedWindowMask

    lengths_q, lengths_k = torch.tensor([7, 0, 30, 13]), torch.tensor([9, 4, 30, 10])
    starts_q, starts_k = torch.cat([torch.zeros(1, dtype=torch.long), lengths_q.cumsum(0)]), torch.cat(
        [torch.zeros(1, dtype=torch.long), lengths_k.cumsum(0)])
    seq_q = torch.repeat_interleave(torch.arange(4), lengths_q)
    seq_k = torch.repeat_interleave(torch.arange(4), lengths_k)
    place_q = torch.arange(50) - starts_q[seq_q] + (lengths_k - lengths_q)[seq_q]  # bottom-right per sequence
    place_k = torch.arange(53) - starts_k[seq_k]
    mask = DocumentMask(lengths_q, lengths_k) & PackedWindowMask(place_q, place_k, *window)
    i, j = torch.arange(50)[:, None], torch.arange(53)[None, :]  # the rule written out pair by pair
    distance = place_q[i] - place_k[j]
    dense = seq_q[i] == seq_k[j]
    if window[0] is not None:
        dense &= distance <= window[0]
    if window[1] is not None:
        dense &= distance >= -window[1]
    torch.testing.assert_close(mask.dense(), dense, atol=0, rtol=0)
    states, exact = mask.block_states(*blocks), reduced_by_loop(dense, *blocks)
    assert ((states == EMPTY) == (exact == EMPTY)).all() and ((states == FULL) == (exact == FULL)).all()
