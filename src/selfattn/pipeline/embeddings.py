"""Step 2 of the seed: turn tokens into vectors, X with one row per token.

Three sources of vectors:
- the seed's own 3-dimensional table (7 hand-made vectors, one per distinct token);
- a seeded random table, clearly untrained: the vector of a token depends only on the
  token, the seed and the width, so "cat" gets the same vector in every sentence;
- a user's table from a file (see ``embedding_files``): a mapping token -> vector, or a
  matrix with one row per token of the sentence.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping

import torch

from selfattn.errors import EmbeddingError
from selfattn.pipeline.embedding_options import SEED_TABLE, check_dim, check_embedding_options, check_table_has
from selfattn.pipeline.tokenize import missing_tokens, quote_tokens



@dataclass(frozen=True)
class EmbeddingSource:
    """Where the vectors of X came from, so every output can say so.

    Attributes:
        kind: "seed", "random", "file", or "given" (passed in directly by the caller).
        trained: whether the vectors were learned; False for every source here.
        description: one line for people, such as "the seed's hand-made 3-dimensional table".
        seed: the random seed, for random vectors; None otherwise.
        path: the file the table was read from, for kind "file"; None otherwise.
        note: why this source was chosen when it was not asked for (the seed's table
            lacks a token, so random vectors are used); None otherwise.
    """

    kind: str  # "seed", "random", "file", or "given" (passed in directly)
    trained: bool  # False for all three here: none of them was learned
    description: str
    seed: int | None = None
    path: str | None = None
    note: str | None = None  # why this source was chosen, when it was not asked for


def embed(tokens: list[str], table: Mapping[str, torch.Tensor | tuple | list] | torch.Tensor) -> torch.Tensor:
    """X[i] = table[tokens[i]]: look up each token's vector.   n tokens -> (n, d)

    Args:
        tokens: the n tokens, in sentence order; a repeated token gets the same vector
            each time.
        table: a mapping token -> vector (d,) (tensor, tuple or list of numbers), looked
            up case-sensitively; or already a matrix (n, d) in sentence order, with one
            row per token.

    Returns:
        X, shape (n, d), float32. A float32 matrix ``table`` comes back as it is, not copied.

    Raises:
        EmbeddingError: a token has no entry in the mapping, the mapping's vectors are
            not all 1-D and of one length (or there are no tokens to look up), or the
            matrix is not 2-D or its row count differs from the number of tokens.

    Examples:
        >>> import selfattn as sa
        >>> sa.embed(["a", "b", "a"], {"a": [1.0, 0.0], "b": [0.0, 2.0]})
        tensor([[1., 0.],
                [0., 2.],
                [1., 0.]])
    """
    if isinstance(table, torch.Tensor):
        return check_matrix(tokens, table).to(torch.float32)
    check_table_has(tokens, table)
    rows = [torch.as_tensor(table[t], dtype=torch.float32) for t in tokens]
    widths = {row.shape for row in rows}
    if len(widths) != 1 or rows[0].dim() != 1:
        raise EmbeddingError(f"embedding vectors must all be 1-D and of one length, got shapes {sorted(widths)}")
    return torch.stack(rows)  # n x (d,) -> (n, d)


def seed_embeddings(tokens: list[str]) -> torch.Tensor:
    """The seed's 3-dimensional vectors for tokens drawn from its table.   n tokens -> (n, 3)

    Args:
        tokens: the n tokens; each must be a key of ``SEED_TABLE`` (case-sensitive).

    Returns:
        X, shape (n, 3), float32, row i the vector of ``tokens[i]``.

    Raises:
        EmbeddingError: a token is not in the seed's table.

    Examples:
        >>> import selfattn as sa
        >>> x = sa.seed_embeddings(sa.tokenize(sa.SEED_SENTENCE))
        >>> x.shape
        torch.Size([7, 3])
        >>> x[1]  # "cat"
        tensor([0.5800, 0.9100, 0.4400])
    """
    return embed(tokens, SEED_TABLE)


def random_embeddings(tokens: list[str], dim: int, seed: int = 0) -> torch.Tensor:
    """Untrained vectors x ~ N(0, 1)^dim, fixed by (token, seed, dim).   n tokens -> (n, dim)

    Each distinct token draws its vector from its own generator, seeded by a hash of
    (seed, dim, token), so "cat" gets the same vector in every sentence and a token's
    vector does not depend on its neighbours. Not affected by torch's global seed.

    Args:
        tokens: the n tokens; repeated tokens get the same vector.
        dim: the width d of each vector, an int from 1 to 1024.
        seed: picks another set of vectors; the same seed gives the same vectors.

    Returns:
        X, shape (n, dim), float32.

    Raises:
        OptionError: ``dim`` is not an int from 1 to 1024.
        EmbeddingError: ``tokens`` is empty.
    """
    check_dim(dim)
    table = {}
    for token in dict.fromkeys(tokens):
        # A per-token generator, so a token's vector does not depend on its neighbours.
        digest = hashlib.sha256(f"{seed}\x00{dim}\x00{token}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        table[token] = torch.randn(dim, generator=generator)
    return embed(tokens, table)


def check_matrix(tokens: list[str], matrix) -> torch.Tensor:
    """``matrix`` itself if it is X for ``tokens``: a 2-D tensor with one row per token.

    Raises:
        EmbeddingError: it is not a tensor, not 2-D, or has another number of rows.
    """
    if not isinstance(matrix, torch.Tensor):
        raise EmbeddingError(f"the embeddings must be a tensor (tokens x dim), got {type(matrix).__name__}")
    if matrix.dim() != 2:
        raise EmbeddingError(f"an embedding matrix must be 2-D (tokens x dim), got shape {tuple(matrix.shape)}")
    if matrix.shape[0] != len(tokens):
        raise EmbeddingError(
            f"the embedding matrix has {matrix.shape[0]} rows but the sentence has {len(tokens)} "
            f"tokens: give one row per token, in sentence order"
        )
    return matrix


def resolve_embeddings(
    tokens: list[str],
    method: str = "auto",
    *,
    path: str | None = None,
    dim: int | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, EmbeddingSource]:
    """Choose and build X for the tokens, returning it with a record of its source.   n tokens -> (n, d)

    With method "auto": the file if ``path`` is given, random vectors of width ``dim``
    if ``dim`` is given, else the seed's table when it knows every token, else random
    vectors of width 3 (and the source's ``note`` says which tokens were missing).

    Args:
        tokens: the n tokens of the sentence.
        method: "auto" (default), "seed" (the seed's table) or "random" (see
            ``random_embeddings``).
        path: an embeddings file (see ``load_embedding_file``); only with method "auto"
            and without ``dim``. None: no file.
        dim: the width of random vectors, 1 to 1024; with method "seed" only 3 is
            accepted. None: 3 for random vectors.
        seed: the seed of random vectors (default 0); recorded only for them.

    Returns:
        X, shape (n, d), float32, and the ``EmbeddingSource`` that says where it came from.

    Raises:
        OptionError: an unknown ``method``, a ``dim`` out of range, a ``seed`` that is not
            an int, or options that exclude each other (``path`` with ``dim`` or with a
            method other than "auto").
        EmbeddingError: the file cannot be read or does not fit the tokens, or method
            "seed" meets a token the seed's table lacks.
    """
    check_embedding_options(method, path, dim, seed)
    if path is not None:
        from selfattn.pipeline.embedding_files import load_embedding_file

        x = embed(tokens, load_embedding_file(path))
        return x, EmbeddingSource("file", False, f"the file {path}", path=str(path))
    note = None
    if method == "auto":
        unknown = missing_tokens(tokens, SEED_TABLE)
        if dim is None and not unknown:
            method = "seed"
        else:
            method = "random"
            if dim is None:
                note = f"the seed's table has no vector for {quote_tokens(unknown, 5)}, so random vectors are used"
    if method == "seed":
        return seed_embeddings(tokens), EmbeddingSource("seed", False, "the seed's hand-made 3-dimensional table")
    dim = 3 if dim is None else dim
    x = random_embeddings(tokens, dim, seed)
    description = f"seeded random N(0, 1) values, dim {dim}, seed {seed} (untrained)"
    return x, EmbeddingSource("random", False, description, seed=seed, note=note)
