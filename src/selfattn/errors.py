"""Typed errors for mistakes in user input.

Every error a user can cause is a subclass of ``SelfAttnError``, which is a
``ValueError``. The CLI prints its message as one line and exits with status 2;
anything else that escapes is our bug and keeps its traceback.
"""

from __future__ import annotations

import difflib


def close_match(word, choices) -> str | None:
    """The choice ``word`` most likely misspells, or None when none is close (difflib's ratio 0.6 or more)."""
    if not isinstance(word, str):
        return None
    found = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word, choices) -> str:
    """A message's ending for a misspelled name: " (did you mean 'causal'?)", or "" when no choice is close."""
    close = close_match(word, choices)
    return f" (did you mean {close!r}?)" if close is not None else ""


class SelfAttnError(ValueError):
    """Base class of every error a user can cause; catch it to catch them all.

    A ``ValueError``: the input or an option is wrong, and the message says how, in one
    line. The CLI prints that line and exits with status 2. Raised only as one of the
    subclasses below.
    """


class SentenceError(SelfAttnError):
    """Raised when the sentence cannot be used.

    It is not a string, it is empty or only whitespace, it holds characters that are
    not UTF-8, or it has more tokens than the chosen output format shows (for example
    more than 24 for text and markdown).
    """


class QueryError(SelfAttnError):
    """Raised when the query does not pick a token of the sentence.

    The query token is not in the sentence (tokens are case-sensitive), its 0-based
    position is out of range, or it is neither a string nor an int.
    """


class EmbeddingError(SelfAttnError):
    """Raised when the embeddings X cannot be built or used.

    A token has no vector in the table, a matrix has the wrong number of rows or is not
    2-D, vectors differ in length, an embeddings file is missing, unreadable or holds
    something other than finite numbers, or the vectors are so large that their dot
    products overflow.
    """


class OptionError(SelfAttnError):
    """Raised when an option is out of range, unknown, or does not combine with another.

    For example an unknown variant or positional encoding, ``--heads`` with a variant
    that has one head, or ``--dim`` together with an embeddings file.
    """


class ShapeError(SelfAttnError):
    """Raised when tensor shapes do not fit together; the message names the shapes involved.

    For example query and keys with different last dimensions, weights with more
    columns than there are value rows, or an odd d_head given to RoPE.
    """


class ConfigError(SelfAttnError):
    """Raised when a model or attention configuration cannot be built.

    For example d_model not divisible by the number of heads, heads not divisible by
    the key/value heads, or a non-positive size.
    """


class OutputError(SelfAttnError):
    """Raised when an output file cannot be written.

    Its extension is not one the output format supports, the path is a folder, its
    folder does not exist, or there is no permission to write there.
    """


class ModelError(SelfAttnError):
    """Raised when a pretrained model cannot be used.

    Its name is unknown, its weights or the packages it needs are not installed, or its
    files do not fit what the loader expects (missing keys, wrong shapes).
    """


class DistributedError(SelfAttnError):
    """Raised when the ranks of a process group cannot run distributed attention together.

    torch.distributed is not initialised, this process is not a member of the given
    process group, the ranks disagree about their inputs, or one of them failed or
    stopped.
    """


class TrainingError(SelfAttnError):
    """Raised when a training run cannot start or continue.

    The task is unknown, the corpus is missing, empty, binary or shorter than the
    context, the output folder cannot be written or holds another run, a setting is
    out of range, or there is no run to resume.
    """
