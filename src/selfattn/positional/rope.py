"""Rotary position embedding, RoPE (Su et al. 2021, "RoFormer").

Each consecutive feature pair (x_2i, x_2i+1) of a query or key at position p is
turned by the angle p * theta_i, with theta_i = base^(-2i/d_head):

    x'_2i   = x_2i cos(p theta_i) - x_2i+1 sin(p theta_i)
    x'_2i+1 = x_2i sin(p theta_i) + x_2i+1 cos(p theta_i)

Read as a complex number, z_i = x_2i + 1j x_2i+1 becomes z_i exp(1j p theta_i).
The score q'_m . k'_n then equals Re sum_i q_i conj(k_i) exp(1j (m - n) theta_i): it
depends on the positions only through m - n, which is why RoPE rotates q and k
rather than adding anything to the embeddings.
"""

from __future__ import annotations

import torch

from selfattn.errors import OptionError, ShapeError


def rope_angles(
    positions: torch.Tensor, d_head: int, base: float = 10000.0, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """angle[p, i] = positions[p] * base^(-2i/d_head).   (seq,) -> (seq, d_head // 2)

    Computed in float64: the product of a large position and a small frequency
    needs the extra digits before cos/sin. Returned in ``dtype`` (float64 by default).

    Args:
        positions: the position p of each token, (seq,), any real or integer dtype.
        d_head: the width of a head's queries and keys; even and at least 2.
        base: sets the frequencies theta_i = base^(-2i/d_head); default 10000, as in
            the paper.
        dtype: the result's dtype (default float64).

    Returns:
        The angles p theta_i, (seq, d_head // 2): column i turns the feature pair (2i, 2i+1).

    Raises:
        ShapeError: ``positions`` is not 1-D, or ``d_head`` is odd or below 2.
        OptionError: ``base`` is not above 0.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> sa.rope_angles(torch.arange(3), 4).tolist()
        [[0.0, 0.0], [1.0, 0.01], [2.0, 0.02]]
    """
    if positions.dim() != 1:
        raise ShapeError(f"positions must be 1-D (seq,), got {tuple(positions.shape)}")
    if d_head < 2 or d_head % 2:
        raise ShapeError(f"d_head must be even and >= 2 for RoPE, got {d_head}")
    if not base > 0:
        raise OptionError(f"base must be > 0, got {base}")
    pair = torch.arange(0, d_head, 2, dtype=torch.float64, device=positions.device)  # (d_head/2,): 2i
    theta = torch.pow(torch.tensor(base, dtype=torch.float64, device=positions.device), -pair / d_head)
    angles = positions.to(torch.float64)[:, None] * theta[None, :]  # (seq, 1) * (1, d_head/2) -> (seq, d_head/2)
    return angles.to(dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0) -> torch.Tensor:
    """x'_(2i, 2i+1) = R(p theta_i) x_(2i, 2i+1).   (..., seq, d_head), (seq,) -> (..., seq, d_head)

    Pairs are neighbours (2i, 2i+1), the paper's interleaved convention. GPT-NeoX and
    LLaMA-style code pairs feature i with feature i + d_head/2 ("rotate half"); the two
    agree up to a fixed permutation of the features, so weights trained with one need
    their q/k projection rows permuted before use with the other.
    Default positions are 0 .. seq-1; pass e.g. arange(cached, cached + seq) for new
    tokens behind a KV cache. The result keeps x's dtype and is differentiable in x.

    Args:
        x: queries or keys, (..., seq, d_head), d_head even.
        positions: the position of each of the seq rows, (seq,). None: 0 .. seq-1.
        base: sets the frequencies theta_i = base^(-2i/d_head); default 10000.

    Returns:
        x with each feature pair turned by its angle, (..., seq, d_head), in x's dtype.

    Raises:
        ShapeError: ``x`` has fewer than 2 dimensions, d_head is odd (or 0), or
            ``positions`` is not (seq,).
        OptionError: ``base`` is not above 0.

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
    seq, d_head = x.shape[-2], x.shape[-1]
    if d_head % 2:
        raise ShapeError(f"RoPE rotates feature pairs, so d_head must be even: x {tuple(x.shape)}")
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    if positions.dim() != 1 or positions.shape[0] != seq:
        raise ShapeError(
            f"positions must be (seq,) with seq = {seq} from x {tuple(x.shape)}, got {tuple(positions.shape)}"
        )
    angles = rope_angles(positions.to(x.device), d_head, base)  # (seq, d_head/2), float64
    cos = torch.cos(angles).to(x.dtype)
    sin = torch.sin(angles).to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., seq, d_head/2) each
    rotated_even = even * cos - odd * sin
    rotated_odd = even * sin + odd * cos
    # Interleave back: (..., seq, d_head/2, 2) -> (..., seq, d_head)
    return torch.stack((rotated_even, rotated_odd), dim=-1).flatten(-2)
