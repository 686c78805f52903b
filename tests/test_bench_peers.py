"""Every benchmark's SDPA peer is called at its best: a mask it is given is 4-D and contiguous.

torch's scaled_dot_product_attention reads a 3-D (H, N, N) mask on a path about 3x slower
than the same numbers as (1, H, N, N); a benchmark that handed it a 3-D mask measured
SDPA's slow path, not SDPA. Here every case of bench/summary.py, bench/flex.py and bench/attention_masks.py runs
once on a small N with SDPA replaced by a spy that records the mask it gets; only the one
row named as a slow call on purpose may give it a 3-D mask.
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
