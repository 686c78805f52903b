"""The attention variants by name, which options each takes, and the defaults they get.

Plain Python: ``ExplainConfig`` checks a variant's options with these (before torch loads,
on the command line), and ``trace_variant`` fills in the same defaults, so the two agree.
"""

from __future__ import annotations

VARIANTS = ("simple", "scaled", "qkv", "causal", "multihead", "gqa", "flash")
"""The attention variants that ``trace_variant`` and ``ExplainConfig.variant`` accept.

Each adds one idea to the seed: "simple" (the seed), "scaled" (1/sqrt(d)), "qkv"
(projections), "causal" (a causal mask), "multihead" (heads and W_o), "gqa" (shared
key/value heads), "flash" (the seed computed block by block with an online softmax).
"""
UNSCALED = ("simple", "flash")  # the seed's raw dot products, no 1/sqrt(d)
PROJECTED = ("qkv", "causal", "multihead", "gqa")  # variants with learned Q/K/V projections
MULTI_HEAD = ("multihead", "gqa")
DEFAULT_HEADS = {"multihead": 2, "gqa": 4}


def distance_check_key(query_index: int, n: int) -> int:
    """The token whose key the positional section's ``distance_check`` uses: the first one that is not the query.

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
