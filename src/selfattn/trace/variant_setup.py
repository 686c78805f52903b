"""What ``trace_variant`` sets up before it runs a variant, and the defaults it fills in.

The head counts and query/key width a variant gets when none are given, the seeded
untrained projections, the learned position table's seed and size, ALiBi's bias and
RoPE's distance check. ``ExplainConfig`` reads the same defaults, so the two agree.
"""

from __future__ import annotations

import math

import torch

from selfattn.attention.modules import MultiHeadAttention
from selfattn.positional import alibi_bias
from selfattn.positional.rope import DistanceScore, rope_distance_check

DEFAULT_HEADS = {"multihead": 2, "gqa": 4}
LEARNED_TABLE_SEED_OFFSET = 1_000_003  # the untrained position table's seed is --seed plus this
LEARNED_TABLE_ROWS = 512  # the untrained table is drawn this long and cut to the sentence


def distance_check_key(query_index: int, n: int) -> int:
    """The token whose key ``VariantTrace.distance_check`` uses: the first one that is not the query.

    Args:
        query_index: the query's 0-based position.
        n: the number of tokens.

    Returns:
        0, or 1 when the query is token 0 (0 again in a one-token sentence).
    """
    return 0 if query_index != 0 else min(1, n - 1)


def default_heads(variant: str, heads: int | None = None, kv_heads: int | None = None) -> tuple[int, int]:
    """(query heads, key/value heads): 2 heads for multihead; 4 sharing 2 for gqa (half, or 1 if odd).

    Args:
        variant: the variant's name, one of ``VARIANTS``.
        heads: the query heads asked for, or None for the variant's default (1 without heads).
        kv_heads: the key/value heads asked for, or None: half the heads for gqa (1 if
            their number is odd), as many as the heads otherwise.

    Returns:
        (query heads, key/value heads).
    """
    heads = heads or DEFAULT_HEADS.get(variant, 1)
    if kv_heads is None:
        kv_heads = (heads // 2 if heads % 2 == 0 else 1) if variant == "gqa" else heads
    return heads, kv_heads


def default_d_k(d: int, heads: int, positional: str) -> int:
    """d / heads, at least 2, and even when RoPE needs feature pairs.

    Args:
        d: the width of the embeddings.
        heads: the number of query heads.
        positional: the positional encoding's name; "rope" rounds down to an even width.

    Returns:
        The width of each head's queries and keys.
    """
    d_k = max(2, d // heads)
    return d_k - d_k % 2 if positional == "rope" else d_k


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
