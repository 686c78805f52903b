"""Typed errors for mistakes in user input.

Every error a user can cause is a subclass of ``SelfAttnError``, which is a
``ValueError``. The CLI prints its message as one line and exits with status 2;
anything else that escapes is our bug and keeps its traceback.
"""


class SelfAttnError(ValueError):
    """Base class: the input or an option is wrong; the message says how."""


class SentenceError(SelfAttnError):
    """The sentence is empty, or too long for the chosen output."""


class QueryError(SelfAttnError):
    """The query token is not in the sentence, or its position is out of range."""


class EmbeddingError(SelfAttnError):
    """An embedding table or file is missing, unreadable or does not fit the tokens."""


class OptionError(SelfAttnError):
    """An option is out of range or does not combine with another."""


class ShapeError(SelfAttnError):
    """Tensor shapes do not fit together; the message names the shapes involved."""


class ConfigError(SelfAttnError):
    """A model or attention configuration cannot be built (e.g. d_model not divisible by heads)."""


class OutputError(SelfAttnError):
    """An output file cannot be written: unsupported extension, missing folder, no permission."""


class ModelError(SelfAttnError):
    """A pretrained model is unknown, not installed, or its files do not fit what we expect."""


class DistributedError(SelfAttnError):
    """The ranks of a process group disagree about their inputs, or one of them stopped."""
