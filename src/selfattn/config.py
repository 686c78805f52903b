"""What one explanation is asked to do, as a frozen, validated record.

CLI flags map one to one onto the fields of ``ExplainConfig``; an invalid value or
combination fails when the config is built, before any work is done.
"""

from __future__ import annotations

from dataclasses import dataclass

from selfattn.errors import OptionError, SentenceError
from selfattn.pipeline.embeddings import SEED_SENTENCE, check_embedding_options, resolve_embeddings
from selfattn.pipeline.tokenize import tokenize
from selfattn.trace import Trace, trace_self_attention

FORMATS = ("text", "json", "markdown")
MIN_PRECISION, MAX_PRECISION = 0, 10
MAX_TEXT_TOKENS = 24  # wider matrices stop being readable as text
MAX_JSON_TOKENS = 512  # three 512 x 512 matrices are already ~15 MB of JSON


@dataclass(frozen=True)
class ExplainConfig:
    sentence: str | None = None  # None: the seed's sentence
    embeddings: str | None = None  # a file with the embedding table
    embed: str = "auto"  # auto | seed | random
    dim: int | None = None  # width of random embeddings
    seed: int = 0
    query: str | int | None = None  # a token or a 0-based position
    precision: int = 4
    format: str = "text"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise OptionError(f"unknown format {self.format!r}: choose one of {', '.join(FORMATS)}")
        check_precision(self.precision)
        check_embedding_options(self.embed, self.embeddings, self.dim, self.seed)

    @property
    def tokens(self) -> list[str]:
        return tokenize(SEED_SENTENCE if self.sentence is None else self.sentence)


def build_trace(config: ExplainConfig) -> Trace:
    """Tokens -> embeddings -> self-attention, with every intermediate recorded."""
    tokens = config.tokens
    check_length(len(tokens), config.format)
    x, source = resolve_embeddings(
        tokens, config.embed, path=config.embeddings, dim=config.dim, seed=config.seed
    )
    return trace_self_attention(tokens, x, config.query, source)


def check_precision(precision: int) -> None:
    if isinstance(precision, bool) or not isinstance(precision, int) or not MIN_PRECISION <= precision <= MAX_PRECISION:
        raise OptionError(
            f"--precision must be an integer from {MIN_PRECISION} to {MAX_PRECISION}, got {precision!r}"
        )


def check_length(n_tokens: int, output_format: str) -> None:
    """Refuse sentences too long to be worth printing in the chosen format."""
    limit = MAX_JSON_TOKENS if output_format == "json" else MAX_TEXT_TOKENS
    if n_tokens > limit:
        hint = f" (use --format json for up to {MAX_JSON_TOKENS})" if output_format != "json" else ""
        raise SentenceError(
            f"the sentence has {n_tokens} tokens; {output_format} output shows at most {limit}{hint}"
        )
