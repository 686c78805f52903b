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


def sinusoidal_score_grid(
    x_q: torch.Tensor,
    x_k: torch.Tensor,
    n_positions: int,
    *,
    w_q: torch.Tensor | None = None,
    w_k: torch.Tensor | None = None,
    base: float = 10000.0,
) -> torch.Tensor:
    """S[i, j] = ((x_q + PE[i]) W_q) . ((x_k + PE[j]) W_k).   (d,), (d,) -> (n_positions, n_positions)

    The score of one fixed pair of embeddings at every pair of positions when the table
    is added to X, the counterpart of ``rope_score_grid``. Expanding the product gives
    x_q.x_k + x_q.PE[j] + PE[i].x_k + PE[i].PE[j]: only the last term depends on i - j
    alone, so the grid is not constant along its diagonals. Without W_q and W_k (the
    seed's attention) both are the identity.

    Args:
        x_q: the query token's embedding, (d,).
        x_k: the key token's embedding, (d,).
        n_positions: how many positions on each axis, at least 1.
        w_q: the query projection, (d, d_k), or None for none; give both or neither.
        w_k: the key projection, (d, d_k), or None for none.
        base: sets the frequencies omega_i = base^(-2i/d); default 10000.

    Returns:
        S, (n_positions, n_positions), in x_q's dtype: row i is x_q at position i,
        column j is x_k at position j.

    Raises:
        ShapeError: ``x_q`` and ``x_k`` are not 1-D of one width, or the projections
            do not fit them and each other.
        OptionError: ``n_positions`` is below 1, only one projection is given, or
            ``base`` is not above 0.

    Examples:
        >>> import torch
        >>> from selfattn.positional.sinusoidal import sinusoidal_score_grid
        >>> grid = sinusoidal_score_grid(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), 3)
        >>> grid.diagonal().round(decimals=4)  # i = j every time, yet the scores differ
        tensor([2.0000, 2.3818, 1.4932])
    """
    if x_q.dim() != 1 or x_k.shape != x_q.shape:
        raise ShapeError(f"x_q and x_k must be single vectors (d,) of one width, got {tuple(x_q.shape)} and {tuple(x_k.shape)}")
    if isinstance(n_positions, bool) or not isinstance(n_positions, int) or n_positions < 1:
        raise OptionError(f"n_positions must be a whole number >= 1, got {n_positions!r}")
    if (w_q is None) != (w_k is None):
        raise OptionError("give both projections w_q and w_k, or neither")
    d = x_q.shape[0]
    table = sinusoidal_encoding(n_positions, d, base, dtype=x_q.dtype, device=x_q.device)  # (n, d)
    queries = x_q + table  # (d,) + (n, d) -> (n, d): row i is x_q placed at position i
    keys = x_k + table  # (n, d): row j is x_k placed at position j
    if w_q is not None:
        if w_q.dim() != 2 or w_q.shape[0] != d or w_k.shape != w_q.shape:
            raise ShapeError(f"w_q and w_k must both be (d, d_k) with d = {d}, got {tuple(w_q.shape)} and {tuple(w_k.shape)}")
        queries = queries @ w_q  # (n, d) @ (d, d_k) -> (n, d_k)
        keys = keys @ w_k  # (n, d) @ (d, d_k) -> (n, d_k)
    return queries @ keys.T  # (n, d_k) @ (d_k, n) -> (n, n)
