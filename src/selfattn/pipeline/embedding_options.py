"""What picks X, checked before anything is computed: the seed's table, random vectors or a file.

The seed's sentence and table, the embedding methods and the width of random vectors, and
the first checks of an embeddings file (it exists, is a file, has an extension a reader
knows). Plain Python, no torch: the command line refuses a bad embedding option before
torch loads. ``embeddings`` builds the vectors, ``embedding_files`` reads the files.
"""

from __future__ import annotations

import os
from pathlib import Path

from selfattn.errors import EmbeddingError, OptionError
from selfattn.pipeline.tokenize import missing_tokens, quote_tokens

SEED_SENTENCE = "The cat sat on the warm mat"
"""The seed's example sentence: seven tokens, every one of them in ``SEED_TABLE``."""

SEED_TABLE: dict[str, tuple[float, float, float]] = {
    "The": (0.41, 0.12, 0.73),
    "cat": (0.58, 0.91, 0.44),
    "sat": (0.33, 0.76, 0.89),
    "on": (0.15, 0.42, 0.67),
    "the": (0.39, 0.14, 0.71),
    "warm": (0.82, 0.53, 0.29),
    "mat": (0.61, 0.85, 0.47),
}
"""The seed's hand-made 3-dimensional embeddings: token -> (x1, x2, x3).

One entry per distinct token of ``SEED_SENTENCE`` (7 of them); case matters, so "The" and
"the" are two entries. Made by hand, not trained.
"""

SEED_DIM = 3  # the width of the seed's table, and of random vectors when none is asked for
MIN_DIM, MAX_DIM = 1, 1024
EMBED_METHODS = ("auto", "seed", "random")
# The extensions an embeddings file may have, each with its reader in ``embedding_files``.
EMBEDDING_EXTENSIONS = (".json", ".csv", ".npy", ".pt", ".pth", ".safetensors")


def check_dim(dim: int) -> None:
    """OptionError unless ``dim`` is an int from MIN_DIM to MAX_DIM."""
    if isinstance(dim, bool) or not isinstance(dim, int) or not MIN_DIM <= dim <= MAX_DIM:
        raise OptionError(f"--dim must be an integer from {MIN_DIM} to {MAX_DIM}, got {dim!r}")


def check_embedding_options(method: str, path: str | None, dim: int | None, seed: int) -> None:
    """Refuse unknown methods, out-of-range widths and options that exclude each other."""
    if method not in EMBED_METHODS:
        raise OptionError(f"unknown embedding method {method!r}: choose one of {', '.join(EMBED_METHODS)}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise OptionError(f"--seed must be an integer, got {seed!r}")
    if not -(2**63) <= seed < 2**64:  # torch's generator takes a 64-bit seed
        raise OptionError(f"--seed must be from {-(2**63)} to {2**64 - 1}, got {seed}")
    if dim is not None:
        check_dim(dim)
    if path is not None:
        if method != "auto":
            raise OptionError(f"--embeddings FILE and --embed {method} exclude each other: choose one")
        if dim is not None:
            raise OptionError("--dim applies only to random embeddings, not to a file")
    if method == "seed" and dim is not None and dim != SEED_DIM:
        raise OptionError("--dim applies only to random embeddings; the seed's table is 3-dimensional")


def check_embedding_path(path: str | os.PathLike) -> Path:
    """The file an embeddings table is read from, if it exists, is a file and has a known extension.

    Args:
        path: the file named by the user.

    Returns:
        ``path`` as a Path.

    Raises:
        EmbeddingError: the file is missing, a folder, or has an extension no reader
            knows (``EMBEDDING_EXTENSIONS``); the message starts with the file's name.
    """
    where = f"embeddings file {os.fspath(path)!r}"
    file = Path(path)
    try:
        if not file.exists():
            raise EmbeddingError(f"{where}: no such file")
        if file.is_dir():
            raise EmbeddingError(f"{where}: is a directory, expected a file")
    except OSError as err:  # a name too long for the file system, say
        raise EmbeddingError(f"{where}: cannot be read ({err.strerror or err})") from err
    if file.suffix.lower() not in EMBEDDING_EXTENSIONS:
        shown = repr(file.suffix) if file.suffix else "(none)"
        raise EmbeddingError(f"{where}: unsupported extension {shown}; supported: {', '.join(EMBEDDING_EXTENSIONS)}")
    return file


def check_table_has(tokens: list[str], table) -> None:
    """EmbeddingError naming the tokens ``table`` (token -> vector) has no vector for."""
    missing = missing_tokens(tokens, table)
    if missing:
        raise EmbeddingError(
            f"no embedding for token{'s' if len(missing) > 1 else ''} {quote_tokens(missing, 8)} "
            "(tokens are case-sensitive)"
        )


def embedding_width(method: str, path: str | None, dim: int | None) -> int | None:
    """The width of X as the options alone decide it; None when a file decides it."""
    if path is not None:
        return None
    return dim if dim is not None else SEED_DIM
