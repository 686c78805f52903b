"""What ``trace_variant`` sets up before it runs a variant, and the defaults it fills in.

The seeded untrained projections, the learned position table's seed and size, ALiBi's
bias and RoPE's distance check. The head counts and query/key width a variant gets when
none are given are in ``variant_names``, which ``ExplainConfig`` reads too.
"""

from __future__ import annotations

import math

import torch

from selfattn.attention.modules import MultiHeadAttention
from selfattn.positional import alibi_bias
from selfattn.positional.rope import DistanceScore, rope_distance_check
from selfattn.trace.variant_names import distance_check_key

LEARNED_TABLE_SEED_OFFSET = 1_000_003  # the untrained position table's seed is --seed plus this
LEARNED_TABLE_ROWS = 512  # the untrained table is drawn this long and cut to the sentence


def distance_check_for(
    positional: str, q_plain: torch.Tensor, k_plain: torch.Tensor, q_index: int
) -> tuple[DistanceScore, ...] | None:
    """Head 0's query and its key head's key (key head 0), unrotated, at the default position pairs.

    In float64, so the scores at one distance agree to every digit the explainer shows.
    """
    if positional != "rope":
        return None
    key = distance_check_key(q_index, q_plain.shape[1])
    q, k = q_plain[0, q_index].double(), k_plain[0, key].double()  # (d_k,) each
    return rope_distance_check(q, k, rotary_dim=q.shape[0] - q.shape[0] % 2)


def alibi_for_variant(positional: str, heads: int, n: int, dtype: torch.dtype) -> torch.Tensor | None:
    return alibi_bias(heads, n, n, dtype=dtype) if positional == "alibi" else None  # (H, n, n)


def seeded_attention(
    d: int, heads: int, kv_heads: int, d_k: int, positional: str, generator: torch.Generator
) -> MultiHeadAttention:
    """Untrained projections, fixed by the seed: W ~ N(0, 1 / fan_in), no biases."""
    inner = positional if positional in ("rope", "alibi") else "none"
    module = MultiHeadAttention(d, heads, kv_heads, bias=False, d_head=d_k, positional=inner)
    with torch.no_grad():
        for layer in (module.w_q, module.w_k, module.w_v, module.w_o):
            layer.weight.normal_(0.0, 1.0 / math.sqrt(layer.in_features), generator=generator)
    return module.eval()
