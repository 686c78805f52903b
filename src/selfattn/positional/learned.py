"""A trained table of position vectors, one row per position (as in GPT-2 and BERT).

    P = weight[offset : offset + n]          (n, d_model), added to the token embeddings

Unlike the sinusoidal code, nothing ties row p to row p + 1: every row is a free
parameter, so the table cannot say anything about positions past max_positions.
"""

from __future__ import annotations

import torch

from selfattn.errors import ConfigError, ShapeError
from selfattn.renamed import renamed_keyword

INIT_STD = 0.02  # GPT-2's initialisation for its position table


class LearnedPositionalEmbedding(torch.nn.Module):
    """Owns weight (max_positions, d_model), drawn from N(0, 0.02^2); forward slices rows.

    Pass a seeded ``torch.Generator`` to get the same untrained table on every run,
    independent of the global random state. ``max_len=``, the old name of ``max_positions``,
    still works for one release and warns.

    Args:
        max_positions: the number of positions the table holds, at least 1.
        d_model: the width of each position vector, at least 1.
        generator: draws the initial table. None: torch's global random state.

    Raises:
        ConfigError: ``max_positions`` or ``d_model`` is below 1.
    """

    def __init__(self, max_positions: int, d_model: int, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if max_positions < 1:
            raise ConfigError(f"max_positions must be >= 1, got {max_positions}")
        if d_model < 1:
            raise ConfigError(f"d_model must be >= 1, got {d_model}")
        self.max_positions = max_positions
        self.d_model = d_model
        self.weight = torch.nn.Parameter(torch.empty(max_positions, d_model))
        torch.nn.init.normal_(self.weight, mean=0.0, std=INIT_STD, generator=generator)

    def forward(self, n_positions: int, offset: int = 0) -> torch.Tensor:
        """P = weight[offset : offset + n_positions].   -> (n_positions, d_model)

        With a KV cache, offset is the number of tokens already seen, so the new
        tokens get the rows for their true positions.

        Args:
            n_positions: how many rows to return, at least 0.
            offset: the first position, at least 0 (default 0).

        Returns:
            P, (n_positions, d_model): a slice of ``weight``, so gradients reach the table.

        Raises:
            ShapeError: ``n_positions`` or ``offset`` is negative, or the positions go
                past ``max_positions``.
        """
        if n_positions < 0:
            raise ShapeError(f"n_positions must be >= 0, got {n_positions}")
        if offset < 0:
            raise ShapeError(f"offset must be >= 0, got {offset}")
        if offset + n_positions > self.max_positions:
            raise ShapeError(
                f"positions {offset}..{offset + n_positions - 1} do not fit the learned table: "
                f"max_positions is {self.max_positions}"
            )
        return self.weight[offset : offset + n_positions]  # (n_positions, d_model)

    def extra_repr(self) -> str:
        return f"max_positions={self.max_positions}, d_model={self.d_model}"


renamed_keyword(LearnedPositionalEmbedding, "max_len", "max_positions")  # DecoderConfig's name for the same number
