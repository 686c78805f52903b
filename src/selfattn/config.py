"""What one explanation is asked to do, as a frozen, validated record.

CLI flags map one to one onto the fields of ``ExplainConfig``; an invalid value or
combination fails when the config is built, before any work is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from selfattn.errors import OptionError, SentenceError
from selfattn.pipeline.embeddings import SEED_SENTENCE, check_embedding_options, resolve_embeddings
from selfattn.pipeline.tokenize import tokenize
from selfattn.kernels.flash import check_block_size
from selfattn.positional import POSITIONAL_NAMES
from selfattn.trace import Trace, trace_self_attention
from selfattn.variant_trace import MULTI_HEAD, PROJECTED, VARIANTS, VariantTrace, default_d_k, default_heads, trace_variant

if TYPE_CHECKING:
    from selfattn.models.model_trace import ModelTrace

FORMATS = ("text", "json", "markdown", "html", "plot")  # html: the explorer; plot: a picture
MIN_PRECISION, MAX_PRECISION = 0, 10
MAX_TEXT_TOKENS = 24  # wider matrices stop being readable as text
MAX_JSON_TOKENS = 512  # three 512 x 512 matrices are already ~15 MB of JSON
MAX_TOKENS = {"text": MAX_TEXT_TOKENS, "markdown": MAX_TEXT_TOKENS, "json": MAX_JSON_TOKENS, "html": 512, "plot": 256}
MAX_HEADS = 16  # one table per head; more stop being readable
MAX_JSON_HEAD_CELLS = 1 << 18  # heads x n x n per matrix in JSON: 512 tokens x 1 head, 128 x 16
MAX_D_K = 256


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
    variant: str = "simple"  # one of VARIANTS
    heads: int | None = None  # query heads (multihead, gqa)
    kv_heads: int | None = None  # key/value heads (gqa)
    d_k: int | None = None  # width of each head's queries and keys (variants with projections)
    positional: str = "none"
    block_size: int | None = None  # keys per block (flash; default 2)
    model: str | None = None  # a pretrained model (all-MiniLM-L6-v2) instead of the variants
    layer: int | None = None  # with model: the layer to explain, from 0 (default 0)
    head: int | None = None  # with model: the head to explain, from 0 (default 0)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise OptionError(f"unknown format {self.format!r}: choose one of {', '.join(FORMATS)}")
        check_precision(self.precision)
        if self.model is not None:
            check_model_options(self)
            return
        if self.layer is not None or self.head is not None:
            raise OptionError("--layer and --head choose a layer and head of a pretrained model: add --model all-MiniLM-L6-v2")
        check_embedding_options(self.embed, self.embeddings, self.dim, self.seed)
        check_variant_options(self.variant, self.heads, self.kv_heads, self.d_k, self.positional, self.block_size)

    @property
    def tokens(self) -> list[str]:
        return tokenize(SEED_SENTENCE if self.sentence is None else self.sentence)


    @property
    def query_heads(self) -> int:
        return default_heads(self.variant, self.heads, self.kv_heads)[0]

    @property
    def key_value_heads(self) -> int:
        return default_heads(self.variant, self.heads, self.kv_heads)[1]


def build_trace(config: ExplainConfig) -> Trace | VariantTrace | ModelTrace:
    """Tokens -> embeddings -> attention, with every intermediate recorded.

    The seed's variant without positional encoding gives the seed's own Trace; every
    other combination gives a VariantTrace; a pretrained model gives a ModelTrace.
    """
    if config.model is not None:
        from selfattn.models.model_trace import trace_model

        return trace_model(
            SEED_SENTENCE if config.sentence is None else config.sentence,
            config.model,
            layer=0 if config.layer is None else config.layer,
            head=0 if config.head is None else config.head,
            query=config.query,
            output_format=config.format,
        )
    tokens = config.tokens
    check_length(len(tokens), config.format)
    x, source = resolve_embeddings(
        tokens, config.embed, path=config.embeddings, dim=config.dim, seed=config.seed
    )
    if config.variant == "simple" and config.positional == "none":
        return trace_self_attention(tokens, x, config.query, source)
    n_heads = config.query_heads
    if config.format in ("json", "html") and n_heads * len(tokens) ** 2 > MAX_JSON_HEAD_CELLS:
        most = int((MAX_JSON_HEAD_CELLS / n_heads) ** 0.5)
        raise SentenceError(
            f"the sentence has {len(tokens)} tokens; {config.format.upper()} output with {n_heads} heads shows "
            f"at most {most} (each head's score and weight matrices are written out)"
        )
    d = int(x.shape[1])
    d_k = config.d_k or (default_d_k(d, config.query_heads, config.positional) if config.variant in PROJECTED else d)
    if config.positional == "rope" and d_k % 2:
        hint = " (give an even --d-k)" if config.variant in PROJECTED else " (use --variant qkv with an even --d-k, or an even --dim)"
        raise OptionError(f"RoPE turns pairs of features, so it needs an even width; this one is {d_k}{hint}")
    return trace_variant(
        tokens,
        x,
        config.variant,
        query=config.query,
        heads=config.query_heads,
        kv_heads=config.key_value_heads,
        d_k=d_k if config.variant in PROJECTED else None,
        positional=config.positional,
        seed=config.seed,
        source=source,
        block_size=config.block_size,
    )


def check_model_options(config: ExplainConfig) -> None:
    """With --model the tokens, embeddings and attention are the model's: refuse the options that would change them."""
    from selfattn.models.files import model_spec

    model_spec(config.model)  # an unknown name fails here, before anything loads
    defaults = {"embeddings": None, "embed": "auto", "dim": None, "seed": 0, "variant": "simple", "heads": None,
                "kv_heads": None, "d_k": None, "positional": "none", "block_size": None}
    for field, default in defaults.items():
        if getattr(config, field) != default:
            flag = "--" + field.replace("_", "-")
            raise OptionError(
                f"{flag} does not apply with --model: the model brings its own tokens, embeddings and attention"
            )
    for flag, value in (("--layer", config.layer), ("--head", config.head)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise OptionError(f"{flag} must be an integer from 0, got {value!r}")


def check_variant_options(variant: str, heads, kv_heads, d_k, positional: str, block_size=None) -> None:
    """Each option must exist, be in range, and belong to the chosen variant."""
    if variant not in VARIANTS:
        raise OptionError(f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}")
    if positional not in POSITIONAL_NAMES:
        raise OptionError(f"unknown positional encoding {positional!r}: choose one of {', '.join(POSITIONAL_NAMES)}")
    for flag, value, upper in (("--heads", heads, MAX_HEADS), ("--kv-heads", kv_heads, MAX_HEADS), ("--d-k", d_k, MAX_D_K)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper):
            raise OptionError(f"{flag} must be an integer from 1 to {upper}, got {value!r}")
    if heads is not None and variant not in MULTI_HEAD:
        raise OptionError(f"--heads applies to --variant multihead or gqa, not {variant}")
    if kv_heads is not None and variant != "gqa":
        raise OptionError(f"--kv-heads applies to --variant gqa, not {variant}")
    if d_k is not None and variant not in PROJECTED:
        raise OptionError(
            f"--d-k applies to the variants with projections ({', '.join(PROJECTED)}); "
            f"in {variant} the keys are the embeddings themselves"
        )
    if block_size is not None:
        check_block_size("--block-size", block_size, None)
        if variant != "flash":
            raise OptionError(f"--block-size applies to --variant flash, not {variant}")
    if variant == "gqa":
        n_heads, n_kv = default_heads(variant, heads, kv_heads)
        if n_kv > n_heads or n_heads % n_kv:
            raise OptionError(
                f"--heads ({n_heads}) must be a multiple of --kv-heads ({n_kv}): "
                f"each key/value head serves a whole group of query heads"
            )


def check_precision(precision: int) -> None:
    if isinstance(precision, bool) or not isinstance(precision, int) or not MIN_PRECISION <= precision <= MAX_PRECISION:
        raise OptionError(
            f"--precision must be an integer from {MIN_PRECISION} to {MAX_PRECISION}, got {precision!r}"
        )


def check_length(n_tokens: int, output_format: str) -> None:
    """Refuse sentences too long to be worth printing in the chosen format."""
    limit = MAX_TOKENS[output_format]
    if n_tokens > limit:
        hint = f" (use --format json for up to {MAX_JSON_TOKENS})" if limit == MAX_TEXT_TOKENS else ""
        raise SentenceError(
            f"the sentence has {n_tokens} tokens; {output_format} output shows at most {limit}{hint}"
        )
