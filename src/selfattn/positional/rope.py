"""Rotary position embedding, RoPE (Su et al. 2021, "RoFormer").

Each consecutive feature pair (x_2i, x_2i+1) of a query or key at position p is
turned by the angle p * theta_i, with theta_i = base^(-2i/d_head):

    x'_2i   = x_2i cos(p theta_i) - x_2i+1 sin(p theta_i)
    x'_2i+1 = x_2i sin(p theta_i) + x_2i+1 cos(p theta_i)

Read as a complex number, z_i = x_2i + 1j x_2i+1 becomes z_i exp(1j p theta_i).
The score q'_m . k'_n then equals Re sum_i q_i conj(k_i) exp(1j (m - n) theta_i): it
depends on the positions only through m - n, which is why RoPE rotates q and k
rather than adding anything to the embeddings. ``rope_scores_at``, ``rope_score_grid``
and ``rope_distance_check`` place one fixed (q, k) pair at many positions to show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from selfattn.errors import OptionError, ShapeError
from selfattn.positional.rope_scaling import Llama3RopeScaling, rope_frequencies


def rope_angles(
    positions: torch.Tensor,
    d_head: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float64,
    scaling: Llama3RopeScaling | None = None,
) -> torch.Tensor:
    """angle[p, i] = positions[p] * base^(-2i/d_head).   (seq,) -> (seq, d_head // 2)

    Computed in float64: the product of a large position and a small frequency
    needs the extra digits before cos/sin. Returned in ``dtype`` (float64 by default).
    Positions may also be (batch, seq), one row per sequence (left-padded batches
    count each row's positions from its first real token); the angles are then
    (batch, seq, d_head // 2).

    Args:
        positions: the position p of each token, (seq,) or (batch, seq), any real or
            integer dtype.
        d_head: the width of a head's queries and keys; even and at least 2.
        base: sets the frequencies theta_i = base^(-2i/d_head); default 10000, as in
            the paper.
        dtype: the result's dtype (default float64).
        scaling: None, or a ``Llama3RopeScaling`` that rescales the frequencies
            (``selfattn.positional.rope_scaling``).

    Returns:
        The angles p theta_i, (seq, d_head // 2) or (batch, seq, d_head // 2): column i
            turns feature pair i.

    Raises:
        ShapeError: ``positions`` is not 1-D or 2-D, or ``d_head`` is odd or below 2.
        OptionError: ``base`` is not above 0.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> sa.rope_angles(torch.arange(3), 4).tolist()
        [[0.0, 0.0], [1.0, 0.01], [2.0, 0.02]]
    """
    if positions.dim() not in (1, 2):
        raise ShapeError(f"positions must be (seq,) or (batch, seq), got {tuple(positions.shape)}")
    if d_head < 2 or d_head % 2:
        raise ShapeError(f"d_head must be even and >= 2 for RoPE, got {d_head}")
    if not base > 0:
        raise OptionError(f"base must be > 0, got {base}")
    theta = rope_frequencies(d_head, base, scaling, positions.device)  # (d_head/2,)
    angles = positions.to(torch.float64)[..., None] * theta  # (..., seq, 1) * (d_head/2,) -> (..., seq, d_head/2)
    return angles.to(dtype)


def apply_rope(
    x: torch.Tensor,
    positions: torch.Tensor | None = None,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    *,
    pairs: str = "interleaved",
    scaling: Llama3RopeScaling | None = None,
) -> torch.Tensor:
    """x'_(2i, 2i+1) = R(p theta_i) x_(2i, 2i+1).   (..., seq, d_head), (seq,) -> (..., seq, d_head)

    By default pairs are neighbours (2i, 2i+1), the paper's interleaved convention.
    GPT-NeoX, Llama, Mistral and Qwen2 pair feature i with feature i + d_head/2
    (``pairs="half"``); the two agree up to a fixed permutation of the features, so a
    checkpoint trained with one is read with the same convention.
    Default positions are 0 .. seq-1; pass e.g. arange(cached, cached + seq) for new
    tokens behind a KV cache. The result keeps x's dtype and is differentiable in x.
    With ``rotary_dim`` only the first rotary_dim features turn (with frequencies
    base^(-2i/rotary_dim)) and the rest pass through: the partial rotation some models
    use, and how an odd width (the seed's 3-d vectors) gets RoPE on its first pair.

    Args:
        x: queries or keys, (..., seq, d_head), d_head even unless ``rotary_dim`` is given.
        positions: the position of each of the seq rows, (seq,); or (batch, seq) for x
            (batch, heads, seq, d_head), one row of positions per sequence. None: 0 .. seq-1.
        base: sets the frequencies theta_i = base^(-2i/d_head); default 10000.
        rotary_dim: how many leading features turn, even, 2 to d_head. None: all of them.
        pairs: "interleaved" (default: pair i is features 2i, 2i+1) or "half" (pair i is
            features i and i + d_head/2).
        scaling: None, or a ``Llama3RopeScaling`` of the frequencies.

    Returns:
        x with each feature pair turned by its angle, (..., seq, d_head), in x's dtype.

    Raises:
        ShapeError: ``x`` has fewer than 2 dimensions, d_head (or ``rotary_dim``) is odd
            or 0, ``rotary_dim`` is wider than x, or ``positions`` is not (seq,) or
            (batch, seq) for a 4-D x.
        OptionError: ``base`` is not above 0, or ``pairs`` is unknown.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])  # one pair, three positions
        >>> sa.apply_rope(x).round(decimals=4)  # turned by 0, 1 and 2 radians
        tensor([[ 1.0000,  0.0000],
                [ 0.5403,  0.8415],
                [-0.4161,  0.9093]])
    """
    if x.dim() < 2:
        raise ShapeError(f"x must be (..., seq, d_head), got {tuple(x.shape)}")
    if pairs not in ROPE_PAIRS:
        raise OptionError(f"unknown RoPE pairing {pairs!r}: choose one of {', '.join(ROPE_PAIRS)}")
    seq, d_head = x.shape[-2], x.shape[-1]
    if rotary_dim is not None and rotary_dim != d_head:
        if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or not 2 <= rotary_dim <= d_head or rotary_dim % 2:
            raise ShapeError(f"rotary_dim must be even, from 2 to the width {d_head} of x, got {rotary_dim!r}")
        turned = apply_rope(x[..., :rotary_dim], positions, base, pairs=pairs, scaling=scaling)  # (..., seq, rotary_dim)
        return torch.cat((turned, x[..., rotary_dim:]), dim=-1)  # the rest passes through: (..., seq, d_head)
    if d_head % 2:
        raise ShapeError(f"RoPE rotates feature pairs, so d_head must be even: x {tuple(x.shape)}")
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    batched = positions.dim() == 2 and x.dim() == 4 and positions.shape[0] in (1, x.shape[0])
    if positions.shape[-1] != seq or not (positions.dim() == 1 or batched):
        raise ShapeError(
            f"positions must be (seq,), or (batch, seq) for x (batch, heads, seq, d_head), with seq = {seq} "
            f"from x {tuple(x.shape)}; got {tuple(positions.shape)}"
        )
    angles = rope_angles(positions.to(x.device), d_head, base, scaling=scaling)  # (seq, d_head/2) or (batch, seq, d_head/2)
    if batched:
        angles = angles[:, None]  # (batch, 1, seq, d_head/2): the same turn for every head
    return rotate_pairs(x, torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype), pairs)


class RopeRotation(NamedTuple):
    """cos and sin of every new token's angles, computed once and shared by all layers.

    Attributes:
        cos: cos(p theta_i), (seq, d_head / 2), or (batch, 1, seq, d_head / 2) for
            positions per row; in the dtype of the queries and keys it will turn.
        sin: sin(p theta_i), the same shape.
    """

    cos: torch.Tensor
    sin: torch.Tensor


def rope_rotation(positions: torch.Tensor, d_head: int, base: float = 10000.0, scaling=None,
                  dtype: torch.dtype = torch.float32) -> RopeRotation:
    """(cos, sin) of the angles p theta_i.   (seq,) or (batch, seq) -> RopeRotation

    What ``apply_rope`` computes before turning x, for callers that turn many tensors at
    the same positions (every layer of a model): angles in float64, then cast to ``dtype``.

    Args:
        positions: (seq,) or (batch, seq).
        d_head: the width of a head, even.
        base: RoPE's frequency base.
        scaling: None or a ``Llama3RopeScaling``.
        dtype: the dtype of the tensors it will turn.

    Returns:
        A ``RopeRotation``; per-row positions get a heads axis of 1.
    """
    angles = rope_angles(positions, d_head, base, scaling=scaling)  # (seq, d/2) or (batch, seq, d/2)
    if angles.dim() == 3:
        angles = angles[:, None]  # (batch, 1, seq, d/2)
    return RopeRotation(torch.cos(angles).to(dtype), torch.sin(angles).to(dtype))


ROPE_PAIRS = ("interleaved", "half")
"""How features are paired for RoPE: neighbours (2i, 2i+1), or i with i + d_head/2."""


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairs: str = "interleaved") -> torch.Tensor:
    """(a, b) -> (a cos - b sin, a sin + b cos) for every feature pair.   (..., seq, d), (..., seq, d/2) x 2 -> (..., seq, d)

    Args:
        x: the vectors, (..., seq, d_head).
        cos: cos of each pair's angle, broadcastable to (..., seq, d_head / 2).
        sin: sin of each pair's angle, the same shape.
        pairs: "interleaved" (pair i = features 2i, 2i+1) or "half" (i, i + d_head/2).

    Returns:
        x turned, (..., seq, d_head).
    """
    if pairs == "half":
        first, second = x.chunk(2, dim=-1)  # (..., seq, d_head/2) each: feature i and i + d_head/2
        return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., seq, d_head/2) each
    rotated_even = even * cos - odd * sin
    rotated_odd = even * sin + odd * cos
    # Interleave back: (..., seq, d_head/2, 2) -> (..., seq, d_head)
    return torch.stack((rotated_even, rotated_odd), dim=-1).flatten(-2)


DISTANCE_CHECK_PAIRS = ((1, 0), (2, 1), (5, 4), (3, 0))
"""The (i, j) position pairs ``rope_distance_check`` uses by default: three at distance 1, one at 3."""


@dataclass(frozen=True)
class DistanceScore:
    """One row of RoPE's distance check: the same q placed at position i, the same k at j.

    Attributes:
        i: the query's position.
        j: the key's position.
        distance: i - j, the only thing the score depends on.
        score: R(i) q . R(j) k, the dot product after turning q to position i and k to
            position j (the raw dot product, before any 1/sqrt(d_k)).
    """

    i: int
    j: int
    distance: int
    score: float


def rope_scores_at(
    q: torch.Tensor,
    k: torch.Tensor,
    positions_i: torch.Tensor,
    positions_j: torch.Tensor,
    base: float = 10000.0,
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """s_m = (R(i_m) q) . (R(j_m) k).   (d_head,), (d_head,), (m,), (m,) -> (m,)

    One query vector and one key vector, placed at m pairs of positions. The result
    keeps q's dtype. By RoPE's construction s_m depends on i_m - j_m only.

    Args:
        q: one query, (d_head,), d_head even, before RoPE.
        k: one key, (d_head,), the same width, before RoPE.
        positions_i: where q sits in each pair, (m,).
        positions_j: where k sits in each pair, (m,).
        base: sets the frequencies theta_i = base^(-2i/d_head); default 10000.
        rotary_dim: turn only the first rotary_dim features, as ``apply_rope``; None: all.

    Returns:
        The m scores, (m,).

    Raises:
        ShapeError: ``q`` and ``k`` are not 1-D of one even width, or the position
            tensors are not 1-D of one length.
        OptionError: ``base`` is not above 0.

    Examples:
        >>> import torch
        >>> from selfattn.positional.rope import rope_scores_at
        >>> q, k = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])
        >>> rope_scores_at(q, k, torch.tensor([1, 2, 3]), torch.tensor([0, 1, 0])).round(decimals=4)
        tensor([ 0.5403,  0.5403, -0.9900])
    """
    _check_pair_of_vectors(q, k, rotary_dim)
    if positions_i.dim() != 1 or positions_j.shape != positions_i.shape:
        raise ShapeError(
            f"positions_i and positions_j must be 1-D of one length, got {tuple(positions_i.shape)} "
            f"and {tuple(positions_j.shape)}"
        )
    m = positions_i.shape[0]
    q_at = apply_rope(q.expand(m, -1), positions_i, base, rotary_dim)  # (m, d_head): row m is q turned to i_m
    k_at = apply_rope(k.expand(m, -1), positions_j, base, rotary_dim)  # (m, d_head): row m is k turned to j_m
    return (q_at * k_at).sum(-1)  # one dot product per row: (m, d_head) -> (m,)


def rope_score_grid(
    q: torch.Tensor, k: torch.Tensor, n_positions: int, base: float = 10000.0, rotary_dim: int | None = None
) -> torch.Tensor:
    """S[i, j] = (R(i) q) . (R(j) k) for i, j in 0 .. n_positions-1.   (d_head,), (d_head,) -> (n, n)

    The score of one fixed (q, k) pair at every pair of positions: constant along each
    diagonal i - j = const, which is what ``plot --kind rope-distance`` draws.

    Args:
        q: one query, (d_head,), d_head even, before RoPE.
        k: one key, (d_head,), the same width, before RoPE.
        n_positions: how many positions on each axis, at least 1.
        base: sets the frequencies theta_i = base^(-2i/d_head); default 10000.
        rotary_dim: turn only the first rotary_dim features, as ``apply_rope``; None: all.

    Returns:
        S, (n_positions, n_positions): row i is q at position i, column j is k at position j.

    Raises:
        ShapeError: ``q`` and ``k`` are not 1-D of one even width.
        OptionError: ``n_positions`` is below 1 or ``base`` is not above 0.

    Examples:
        >>> import torch
        >>> from selfattn.positional.rope import rope_score_grid
        >>> grid = rope_score_grid(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0]), 3)
        >>> grid.round(decimals=4)  # cos(i - j): the same along each diagonal
        tensor([[ 1.0000,  0.5403, -0.4161],
                [ 0.5403,  1.0000,  0.5403],
                [-0.4161,  0.5403,  1.0000]])
    """
    _check_pair_of_vectors(q, k, rotary_dim)
    if isinstance(n_positions, bool) or not isinstance(n_positions, int) or n_positions < 1:
        raise OptionError(f"n_positions must be a whole number >= 1, got {n_positions!r}")
    positions = torch.arange(n_positions, device=q.device)
    q_at = apply_rope(q.expand(n_positions, -1), positions, base, rotary_dim)  # (n, d_head): row i is q turned to i
    k_at = apply_rope(k.expand(n_positions, -1), positions, base, rotary_dim)  # (n, d_head): row j is k turned to j
    return q_at @ k_at.T  # (n, d_head) @ (d_head, n) -> (n, n)


def rope_distance_check(
    q: torch.Tensor,
    k: torch.Tensor,
    pairs: tuple[tuple[int, int], ...] = DISTANCE_CHECK_PAIRS,
    base: float = 10000.0,
    rotary_dim: int | None = None,
) -> tuple[DistanceScore, ...]:
    """One record (i, j, i - j, (R(i) q) . (R(j) k)) per position pair.   (d_head,), (d_head,) -> records

    What the explainer shows under RoPE: pairs at the same distance give the same
    score, up to rounding in q's dtype, and another distance gives another score.

    Args:
        q: one query, (d_head,), d_head even, before RoPE.
        k: one key, (d_head,), the same width, before RoPE.
        pairs: the (i, j) positions, whole numbers >= 0; default ``DISTANCE_CHECK_PAIRS``,
            (1, 0), (2, 1), (5, 4) at distance 1 and (3, 0) at distance 3.
        base: sets the frequencies theta_i = base^(-2i/d_head); default 10000.
        rotary_dim: turn only the first rotary_dim features, as ``apply_rope``; None: all.

    Returns:
        One ``DistanceScore`` per pair, in the order given.

    Raises:
        ShapeError: ``q`` and ``k`` are not 1-D of one even width.
        OptionError: ``pairs`` is empty or holds something other than pairs of whole
            numbers >= 0, or ``base`` is not above 0.

    Examples:
        >>> import torch
        >>> from selfattn.positional.rope import rope_distance_check
        >>> rows = rope_distance_check(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
        >>> [(r.i, r.j, r.distance, round(r.score, 4)) for r in rows]
        [(1, 0, 1, 0.8415), (2, 1, 1, 0.8415), (5, 4, 1, 0.8415), (3, 0, 3, 0.1411)]
    """
    if not pairs or not all(_is_position_pair(pair) for pair in pairs):
        raise OptionError(f"pairs must be one or more (i, j) pairs of whole numbers >= 0, got {pairs!r}")
    positions_i = torch.tensor([i for i, _ in pairs], device=q.device)  # (m,)
    positions_j = torch.tensor([j for _, j in pairs], device=q.device)  # (m,)
    scores = rope_scores_at(q, k, positions_i, positions_j, base, rotary_dim)  # (m,)
    return tuple(DistanceScore(i, j, i - j, score) for (i, j), score in zip(pairs, scores.tolist()))


def _is_position_pair(pair) -> bool:
    return (
        isinstance(pair, tuple)
        and len(pair) == 2
        and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in pair)
    )


def _check_pair_of_vectors(q: torch.Tensor, k: torch.Tensor, rotary_dim: int | None = None) -> None:
    if q.dim() != 1 or k.shape != q.shape:
        raise ShapeError(f"q and k must be single vectors (d_head,) of one width, got {tuple(q.shape)} and {tuple(k.shape)}")
    if rotary_dim is None and (q.shape[0] < 2 or q.shape[0] % 2):
        raise ShapeError(f"RoPE rotates feature pairs, so q and k need an even width >= 2, got {q.shape[0]}")
