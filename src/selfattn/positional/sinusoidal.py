"""Fixed sine/cosine position codes (Vaswani et al. 2017, "Attention Is All You Need").

Column pair (2i, 2i+1) holds one frequency omega_i = base^(-2i/d_model):

    PE[pos, 2i]   = sin(pos * omega_i)
    PE[pos, 2i+1] = cos(pos * omega_i)

Moving k positions turns each (sin, cos) pair by the angle k * omega_i, a rotation
that does not depend on pos; the paper picks this code so relative offsets are
a linear map away. The table is added to the token embeddings before attention.
"""

from __future__ import annotations

import torch

from selfattn.errors import OptionError, ShapeError


def sinusoidal_encoding(
    n_positions: int,
    d_model: int,
    base: float = 10000.0,
    *,
    offset: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos base^(-2i/d)), PE[pos, 2i+1] = cos(pos base^(-2i/d)).   -> (n_positions, d_model)

    Rows are positions offset .. offset + n_positions - 1. An odd d_model keeps a
    final sine column without its cosine partner. Angles are formed in float64 and
    only the finished table is cast, because pos * omega in float32 loses digits
    once pos is in the thousands, and sin of a rounded angle is visibly off.

    Args:
        n_positions: how many positions (rows), at least 0.
        d_model: the width of each row, at least 1; the same as the embeddings', since
            the table is added to them.
        base: sets the frequencies omega_i = base^(-2i/d_model); default 10000, as in
            the paper.
        offset: the first position (default 0), at least 0.
        dtype: the result's dtype (default float32).
        device: where to build the table. None: the default device.

    Returns:
        PE, (n_positions, d_model): row r encodes position offset + r.

    Raises:
        ShapeError: ``n_positions`` is negative or ``d_model`` is below 1.
        OptionError: ``offset`` is negative or ``base`` is not above 0.

    Examples:
        >>> import selfattn as sa
        >>> sa.sinusoidal_encoding(3, 4).round(decimals=4)
        tensor([[ 0.0000,  1.0000,  0.0000,  1.0000],
                [ 0.8415,  0.5403,  0.0100,  1.0000],
                [ 0.9093, -0.4161,  0.0200,  0.9998]])
    """
    if n_positions < 0:
        raise ShapeError(f"n_positions must be >= 0, got {n_positions}")
    if d_model < 1:
        raise ShapeError(f"d_model must be >= 1, got {d_model}")
    if offset < 0:
        raise OptionError(f"offset must be >= 0, got {offset}")
    if not base > 0:
        raise OptionError(f"base must be > 0, got {base}")
    positions = torch.arange(offset, offset + n_positions, dtype=torch.float64, device=device)  # (n,)
    pair = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)  # (ceil(d/2),): the values 2i
    omega = torch.pow(torch.tensor(base, dtype=torch.float64, device=device), -pair / d_model)
    angles = positions[:, None] * omega[None, :]  # (n, 1) * (1, ceil(d/2)) -> (n, ceil(d/2))
    table = torch.empty(n_positions, d_model, dtype=torch.float64, device=device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])  # odd d_model: the last sine has no cosine
    return table.to(dtype)
