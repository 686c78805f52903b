"""ALiBi: attention with linear biases (Press et al. 2022, "Train Short, Test Long").

No position vectors at all: each head h adds a penalty proportional to distance
to its scores before the softmax,

    score[h, i, j] += -m_h * |pos_q(i) - j|

with a fixed slope m_h per head. Steep heads look locally, shallow heads far away;
since the bias is a plain function of distance it extends to any length.
"""

from __future__ import annotations

import math

import torch

from selfattn.errors import ShapeError


def _power_of_two_slopes(n: int) -> list[float]:
    # Geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8): the last head is always 1/256.
    return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """m_k = 2^(-8k/n) for k = 1..n when n is a power of two.   -> (n_heads,) float64

    Other head counts follow the authors' released rule: with m the largest power of
    two below n, take the m slopes for m heads, then fill the remaining n - m heads
    with every other slope (the 1st, 3rd, 5th, ...) of the 2m-head sequence. Those
    fall between the first m, so the list is not monotone; it is exactly what
    trained ALiBi checkpoints (BLOOM, MPT) expect, head for head. One head gets 1/256.

    Args:
        n_heads: the number of attention heads, at least 1.

    Returns:
        The slopes m_h, (n_heads,), float64, head 0 first.

    Raises:
        ShapeError: ``n_heads`` is below 1.

    Examples:
        >>> import selfattn as sa
        >>> sa.alibi_slopes(4).tolist()
        [0.25, 0.0625, 0.015625, 0.00390625]
        >>> sa.alibi_slopes(3).tolist()  # 2 heads' slopes, then one from the 4-head list
        [0.0625, 0.00390625, 0.25]
    """
    if n_heads < 1:
        raise ShapeError(f"n_heads must be >= 1, got {n_heads}")
    m = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = _power_of_two_slopes(m)
    if m != n_heads:
        slopes += _power_of_two_slopes(2 * m)[0::2][: n_heads - m]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(
    n_heads: int,
    q_len: int,
    kv_len: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """bias[h, i, j] = -m_h |pos_q(i) - j|, pos_q(i) = kv_len - q_len + i.   -> (n_heads, q_len, kv_len)

    Queries are aligned bottom-right: the last query sits at key position kv_len - 1,
    so with a KV cache the new tokens keep their true positions. Where j <= pos_q(i),
    the causal part, this is the paper's m_h (j - pos_q(i)). The upper part mirrors it;
    a causal mask removes it anyway, and a non-causal model gets a symmetric penalty.
    If q_len > kv_len the first queries get negative positions; the formula still holds.
    The diagonal (distance 0) holds -0.0.

    Args:
        n_heads: the number of heads, at least 1.
        q_len: the number of queries, at least 0.
        kv_len: the number of keys, at least 0.
        dtype: the result's dtype (default float32); computed in float64 first.
        device: where to build the bias. None: the default device.
        slopes: the slopes m_h, (n_heads,), any dtype. None: ``alibi_slopes(n_heads)``.

    Returns:
        The bias to add to the scores, (n_heads, q_len, kv_len).

    Raises:
        ShapeError: ``n_heads`` is below 1, ``q_len`` or ``kv_len`` is negative, or
            ``slopes`` is not (n_heads,).

    Examples:
        >>> import selfattn as sa
        >>> sa.alibi_bias(2, 1, 4).tolist()  # one query, at key position 3
        [[[-0.1875, -0.125, -0.0625, -0.0]], [[-0.01171875, -0.0078125, -0.00390625, -0.0]]]
    """
    if n_heads < 1:
        raise ShapeError(f"n_heads must be >= 1, got {n_heads}")
    if q_len < 0 or kv_len < 0:
        raise ShapeError(f"q_len and kv_len must be >= 0, got q_len={q_len}, kv_len={kv_len}")
    if slopes is None:
        slopes = alibi_slopes(n_heads)
    if slopes.shape != (n_heads,):
        raise ShapeError(f"slopes must be ({n_heads},) for {n_heads} heads, got {tuple(slopes.shape)}")
    slopes = slopes.to(device=device, dtype=torch.float64)
    query_pos = torch.arange(kv_len - q_len, kv_len, dtype=torch.float64, device=device)  # (q_len,)
    key_pos = torch.arange(kv_len, dtype=torch.float64, device=device)  # (kv_len,)
    distance = (query_pos[:, None] - key_pos[None, :]).abs()  # (q_len, 1) - (1, kv_len) -> (q_len, kv_len)
    bias = -slopes[:, None, None] * distance[None, :, :]  # (heads, 1, 1) * (1, q_len, kv_len) -> (heads, q_len, kv_len)
    return bias.to(dtype)
