"""flash_attention never materialises a q_len x kv_len tensor, forward or backward; nor do
flex_attention (score_mod, block_mask), flash_attn_func (softcap, ALiBi, window) and
flash_attn_varlen_func (packed sequences), which run on it.

A TorchDispatchMode sees every aten operation below autograd, including those inside the
custom autograd Function's forward and backward, and records the size of every tensor
they produce. At N = 2048 a score matrix has 4M elements while a tile of 128 x 256 has 32k,
so any produced tensor of N * N / 4 elements or more would be a (partial) score matrix.
The naive reference must trip the same detector, or the detector proves nothing.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import selfattn as sa
from selfattn import flash_attention, padding_mask, scaled_dot_product_attention

N = 2048
D = 32
LARGE = N * N // 4
SCORE_BYTES = N * N * 4  # one float32 N x N score matrix


class LargestTensors(TorchDispatchMode):
    """Records, per operation, the element count of each tensor it returns."""

    def __init__(self) -> None:
        super().__init__()
        self.produced: list[tuple[str, int]] = []
        self.nbytes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for item in tree_flatten(result)[0]:
            if isinstance(item, torch.Tensor):
                self.produced.append((str(func), item.numel()))
                self.nbytes.append(item.numel() * item.element_size())
        return result

    def large(self) -> list[tuple[str, int]]:
        return [(name, numel) for name, numel in self.produced if numel >= LARGE]


def record_forward_and_backward(attend, **kwargs):
    """(forward recorder, backward recorder) for one call of attend on (1, 1, N, D) inputs."""
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 1, N, D, generator=generator).requires_grad_() for _ in range(3))
    upstream = torch.randn(1, 1, N, D, generator=generator)
    with LargestTensors() as forward:
        output = attend(query, key, value, **kwargs)
    with LargestTensors() as backward:
        grads = torch.autograd.grad(output, (query, key, value), upstream)
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    return forward, backward


@pytest.fixture(scope="module")
def naive_recorders():
    return record_forward_and_backward(scaled_dot_product_attention, is_causal=True)


def test_the_detector_sees_the_reference_score_matrix(naive_recorders):
    forward, backward = naive_recorders
    assert any(numel == N * N for _, numel in forward.large()), "the naive forward must show an N x N tensor"
    assert any(numel == N * N for _, numel in backward.large()), "the naive backward must show an N x N tensor"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(is_causal=True),
        dict(attn_mask=causal_lower_right(N, N)),
        dict(attn_mask=padding_mask([N - 100], N)),  # a broadcast (batch, 1, 1, N) mask
    ],
    ids=["no mask", "causal", "causal lower right", "padding"],
)
def test_flash_allocates_no_score_matrix(kwargs):
    forward, backward = record_forward_and_backward(flash_attention, block_q=128, block_k=256, **kwargs)
    assert len(forward.produced) > 100 and len(backward.produced) > 100  # the mode saw the tiles' operations
    assert forward.large() == [], f"forward produced {forward.large()[:3]}"
    assert backward.large() == [], f"backward produced {backward.large()[:3]}"
    largest = max(numel for _, numel in forward.produced + backward.produced)
    assert largest <= max(128 * 256, N * D), f"largest tensor {largest}: more than a tile or an input"


SLOPES = torch.tensor([0.25])  # one head's ALiBi slope


def alibi(score, b, h, q_idx, kv_idx):
    return score + SLOPES[h] * (kv_idx - q_idx)


def softcap(score, b, h, q_idx, kv_idx):
    return 30 * torch.tanh(score / 30)


def causal_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 256)


DOCUMENT = torch.arange(N) * 3 // N  # three packed documents


def same_document(b, h, q_idx, kv_idx):
    return DOCUMENT[q_idx] == DOCUMENT[kv_idx]


def as_flash_attn(q, k, v, **kwargs):
    """flash_attn_func on (1, 1, N, D) tensors, through its (batch, seqlen, nheads, headdim) layout (views)."""
    out = sa.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kwargs)
    return out.transpose(1, 2)


LENGTHS = torch.tensor([700, 1, 300, 1047])  # packed sequences, N in all; one of a single token
CU_SEQLENS = torch.cat([torch.zeros(1, dtype=torch.int32), LENGTHS.cumsum(0).int()])


def as_varlen(q, k, v, **kwargs):
    """flash_attn_varlen_func on (1, 1, N, D) tensors, packed as (total, nheads, headdim) (views)."""
    packed = [t[0].transpose(0, 1) for t in (q, k, v)]  # (N, 1, D)
    longest = int(LENGTHS.max())
    out = sa.flash_attn_varlen_func(*packed, CU_SEQLENS, CU_SEQLENS, longest, longest, **kwargs)
    return out.transpose(0, 1)[None]


def assert_no_score_matrix(forward, backward):
    assert len(forward.produced) > 20 and len(backward.produced) > 20  # the mode saw the tiles' operations
    assert forward.large() == [], f"forward produced {forward.large()[:3]}"
    assert backward.large() == [], f"backward produced {backward.large()[:3]}"
    largest = max(forward.nbytes + backward.nbytes)
    assert largest <= SCORE_BYTES // 8, f"largest tensor {largest} bytes: an N x N float32 score matrix is {SCORE_BYTES}"


@pytest.mark.parametrize(
    "attend,kwargs",
    [
        (sa.flex_attention, dict(score_mod=alibi)),
        (sa.flex_attention, dict(block_mask="causal window")),
        (sa.flex_attention, dict(score_mod=softcap, block_mask="documents")),
        (as_flash_attn, dict(causal=True, window_size=(256, 0), softcap=30.0, alibi_slopes=SLOPES)),
        (as_varlen, dict(causal=True)),
    ],
    ids=["flex alibi", "flex block mask", "flex softcap and documents", "flash_attn_func", "flash_attn_varlen_func"],
)
def test_flex_and_flash_attn_allocate_no_score_matrix(attend, kwargs):
    """The block mask is made before recording (its one sweep is create_block_mask's, not the attention's)."""
    mods = {"causal window": causal_window, "documents": same_document}
    if "block_mask" in kwargs:
        kwargs = dict(kwargs, block_mask=sa.create_block_mask(mods[kwargs["block_mask"]], None, None, N, N))
    forward, backward = record_forward_and_backward(attend, **kwargs)
    assert_no_score_matrix(forward, backward)
