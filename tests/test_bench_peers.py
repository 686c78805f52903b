"""Every benchmark's SDPA peer is called at its best: a mask it is given is 4-D and contiguous.

torch's scaled_dot_product_attention reads a 3-D (H, N, N) mask on a path about 3x slower
than the same numbers as (1, H, N, N); a benchmark that handed it a 3-D mask measured
SDPA's slow path, not SDPA. Here every case of bench/summary.py, bench/flex.py and bench/attention_masks.py runs
once on a small N with SDPA replaced by a spy that records the mask it gets; only the one
row named as a slow call on purpose may give it a 3-D mask. bench/attention.py (its is_causal
cases and its older bool-mask cases), the SDPA side of bench/kernel_ab.py and bench/busy.py,
and the SDPA peers of bench/gpu.py (the CPU stand-in here; cuDNN's take the same masks) are
held to the same rule. bench/ring.py times no peer: SDPA there only checks the numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))


@pytest.fixture
def sdpa_calls(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, *args, **kwargs):
        calls.append(attn_mask)
        return real(q, k, v, attn_mask, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def held_to_the_fast_shape(masks) -> list[str]:
    return [f"{tuple(m.shape)}, contiguous {m.is_contiguous()}" for m in masks
            if m is not None and not (m.dim() == 4 and m.is_contiguous())]


def test_summary_gives_sdpa_4d_masks(sdpa_calls):
    import summary

    from attention import make_inputs

    for label, _, _, ours, peer, _, gqa in summary.cases(64):
        qkv, _ = make_inputs(64, False, kv_heads=2 if gqa else summary.HEADS)
        before = len(sdpa_calls)
        with torch.no_grad():
            peer(*qkv)
            ours(*qkv)
        made = sdpa_calls[before:]
        if label == summary.SLOW_PEER:
            assert made and made[0].dim() == 3  # the slow call, named as such
            continue
        assert held_to_the_fast_shape(made) == [], label


def test_flex_bench_gives_sdpa_4d_masks(sdpa_calls):
    import flex

    from attention import make_inputs

    inputs = {"forward": [make_inputs(64, False)], "fwd+bwd": [make_inputs(64, True)]}
    cases, _ = flex.build_cases(64, 8, inputs, compile_flex=False)
    assert cases
    for case in cases:
        for call in case.impls.values():
            qkv = make_inputs(64, False)[0]
            with torch.no_grad():
                call(*qkv)
    assert sdpa_calls and held_to_the_fast_shape(sdpa_calls) == []


def test_the_mask_benchmark_gives_sdpa_4d_masks(sdpa_calls):
    import attention_masks

    rows = attention_masks.time_masks(1, n=256, log=lambda *a: None)
    assert rows and sdpa_calls and held_to_the_fast_shape(sdpa_calls) == []


def test_the_attention_benchmark_gives_sdpa_4d_masks(sdpa_calls, monkeypatch):
    import attention

    monkeypatch.setattr(attention, "MASK_CASES", [(1, 4, 2, 64, 16, "gqa"), (2, 4, 4, 48, 16, "bool mask")])
    rows = attention.mask_cases(1)
    for causal in (False, True):
        attention.time_case(attention.Case(64, causal, "fwd+bwd"), ("sdpa", "flash"), 1)
    assert len(rows) == 4 and sdpa_calls
    assert any(m is not None for m in sdpa_calls)  # the bool-mask cases reached SDPA with their mask
    assert held_to_the_fast_shape(sdpa_calls) == []


def test_the_kernel_ab_and_busy_peer_passes_no_mask(sdpa_calls):
    import kernel_ab

    import selfattn

    qkv, _ = __import__("attention").make_inputs(64, False)
    for mask in ("none", "causal"):
        with torch.no_grad():
            kernel_ab.attention_call(selfattn, torch, "sdpa", mask, 64)(*qkv)
    assert sdpa_calls == [None, None]  # is_causal or nothing: SDPA's own fastest paths


@pytest.mark.parametrize("mask", ["causal", "window", "documents"])
def test_the_gpu_benchmark_gives_sdpa_4d_masks(sdpa_calls, mask):
    import gpu_cases

    grid = gpu_cases.Grid(device="cpu", heads=2, head_dim=16, window=16, dtypes=(torch.float32,))
    case = gpu_cases.make_case(mask, 64, 1, torch.float32, grid)
    for side in gpu_cases.make_sdpa_cpu(case, gpu_cases.State(grid)):
        with torch.no_grad():
            side.fn(*side.frozen)
    assert len(sdpa_calls) == 1
    assert held_to_the_fast_shape(sdpa_calls) == []
