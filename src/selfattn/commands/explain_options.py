"""What one explanation is asked to do, as a frozen, validated record.

CLI flags map one to one onto the fields of ``ExplainConfig``; an invalid value or
combination fails when the config is built, before any work is done. ``check_toy_inputs``
goes on to the sentence, the query and the embeddings file of the toy variants. Plain
Python, no torch: the command line runs both before torch loads, so a bad argument is
refused at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from selfattn.errors import OptionError, SentenceError, did_you_mean
from selfattn.formatting import check_precision
from selfattn.kernels.tile_sizes import check_block_size
from selfattn.models import locate
from selfattn.pipeline.embedding_options import (
    SEED_SENTENCE,
    SEED_TABLE,
    check_embedding_options,
    check_embedding_path,
    check_table_has,
    embedding_width,
)
from selfattn.pipeline.tokenize import find_query, tokenize
from selfattn.positional import POSITIONAL_NAMES
from selfattn.trace.variant_names import MULTI_HEAD, PROJECTED, VARIANTS, default_d_k, default_heads

FORMATS = ("text", "json", "markdown", "html", "plot")  # html: the explorer; plot: a picture
# The toy variants' positions, as many as all-MiniLM-L6-v2 has: a sentence of up to this many
# tokens runs in every format (text summarises the wide matrices, JSON holds every number).
# A pretrained model takes as many tokens as its own positions allow.
MAX_TOKENS = 512
# Every head keeps a dozen n x n steps, all of them in the JSON (about 45 MB per head at 512
# tokens): heads x tokens^2 stays within this, 512 tokens with up to 4 heads, 256 with 16.
MAX_HEAD_CELLS = 1 << 20
MAX_HEADS = 16  # one table per head; more stop being readable
MAX_D_K = 256


@dataclass(frozen=True)
class ExplainConfig:
    """What one explanation is asked to do; the CLI's flags, one field each.

    Frozen and validated when built: an unknown name, a value out of range or options
    that do not belong together raise before any work is done. The sentence and the
    query are checked later, by ``build_trace``. ``build_trace(config)`` runs it.

    Attributes:
        sentence: the text to explain. None (default): the seed's sentence,
            ``SEED_SENTENCE``.
        embeddings: a file holding the embedding table (see ``load_embedding_file``);
            only with ``embed="auto"`` and no ``dim``. None: no file.
        embed: how to build X: "auto" (default; the file if given, random if ``dim`` is
            given, else the seed's table when it knows every token, else random),
            "seed" or "random".
        dim: the width of random embeddings, 1 to 1024. None: 3 for random embeddings.
        seed: seeds the random embeddings and every untrained weight (projections,
            learned position table); default 0.
        query: the query token, or its 0-based position; a negative position counts
            from the end (-1: the last token). None: position 1 ("cat" in the seed), or 0
            for a one-token sentence.
        precision: digits after the decimal point in the output, 0 to 10 (default 4).
        format: "text" (default), "json", "markdown", "html" (the explorer) or "plot".
        variant: the attention variant, one of ``VARIANTS``; "simple" (default) is the
            seed's softmax(X X^T) X.
        heads: query heads, 1 to 16; only for "multihead" and "gqa". None: 2 for
            multihead, 4 for gqa.
        kv_heads: key/value heads, 1 to 16; only for "gqa", and ``heads`` must be a
            multiple of it. None: half the query heads, or 1 if their number is odd.
        d_k: the width of each head's queries and keys, 1 to 256; only for the variants
            with projections ("qkv", "causal", "multihead", "gqa"). None: d / heads, at
            least 2 and, with RoPE, even.
        positional: the positional encoding: "none" (default), "sinusoidal",
            "learned", "rope" or "alibi".
        block_size: keys per block, a positive int; only for "flash". None: 2.
        model: a pretrained model (all-MiniLM-L6-v2) to explain instead of the
            variants; it brings its own tokens, embeddings and attention, so
            ``embeddings``, ``embed``, ``dim``, ``seed``, ``variant``, ``heads``,
            ``kv_heads``, ``d_k``, ``positional`` and ``block_size`` must keep their
            defaults. None: no model.
        layer: with ``model``, the layer to explain, from 0. None: 0.
        head: with ``model``, the head to explain, from 0. None: 0.

    Raises:
        OptionError: a field is out of range, unknown, or does not combine with the others.
        ModelError: ``model`` names no known model.

    Examples:
        >>> import selfattn as sa
        >>> config = sa.ExplainConfig(variant="gqa")
        >>> config.query_heads, config.key_value_heads
        (4, 2)
    """

    sentence: str | None = None  # None: the seed's sentence
    embeddings: str | None = None  # a file with the embedding table
    embed: str = "auto"  # auto | seed | random
    dim: int | None = None  # width of random embeddings
    seed: int = 0
    query: str | int | None = None  # a token or a 0-based position (negative: from the end)
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
    # The model's name resolved (a built-in name, or a folder's full path) when the config is
    # checked, so that build_trace loads it without resolving the name again.
    model_key: str | None = field(default=None, init=False, repr=False, compare=False)

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
        """The sentence's tokens (the seed's sentence if none was given); SentenceError if it is empty."""
        return tokenize(SEED_SENTENCE if self.sentence is None else self.sentence)


    @property
    def query_heads(self) -> int:
        """The number of query heads: ``heads``, or the variant's default (1 for single-head variants)."""
        return default_heads(self.variant, self.heads, self.kv_heads)[0]

    @property
    def key_value_heads(self) -> int:
        """The number of key/value heads: ``kv_heads`` if given, else half the query heads for gqa (1 if odd), else as many as the query heads."""
        return default_heads(self.variant, self.heads, self.kv_heads)[1]


def check_model_options(config: ExplainConfig) -> None:
    """With --model the tokens, embeddings and attention are the model's: refuse the options that would change them."""
    # A model that is not there fails here, before anything loads; the resolved name is kept.
    object.__setattr__(config, "model_key", locate.model_key(config.model))
    defaults = {"embeddings": None, "embed": "auto", "dim": None, "seed": 0, "variant": "simple", "heads": None,
                "kv_heads": None, "d_k": None, "positional": "none", "block_size": None}
    for name, default in defaults.items():
        if getattr(config, name) != default:
            flag = "--" + name.replace("_", "-")
            raise OptionError(
                f"{flag} does not apply with --model: the model brings its own tokens, embeddings and attention"
            )
    for flag, value in (("--layer", config.layer), ("--head", config.head)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise OptionError(f"{flag} must be an integer from 0, got {value!r}")


def check_variant_options(variant: str, heads, kv_heads, d_k, positional: str, block_size=None) -> None:
    """Each option must exist, be in range, and belong to the chosen variant."""
    if variant not in VARIANTS:
        raise OptionError(f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}{did_you_mean(variant, VARIANTS)}")
    if positional not in POSITIONAL_NAMES:
        raise OptionError(f"unknown positional encoding {positional!r}: choose one of {', '.join(POSITIONAL_NAMES)}"
                          f"{did_you_mean(positional, POSITIONAL_NAMES)}")
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


def check_length(n_tokens: int, heads: int = 1) -> None:
    """Refuse a sentence longer than the toy variants take, in any format: ``MAX_TOKENS``, and
    ``heads`` x tokens^2 within ``MAX_HEAD_CELLS``."""
    if n_tokens > MAX_TOKENS:
        raise SentenceError(
            f"the sentence has {n_tokens} tokens; without --model a sentence takes at most {MAX_TOKENS} "
            "(the toy variants' positions), in every format"
        )
    if heads * n_tokens**2 > MAX_HEAD_CELLS:
        most = int((MAX_HEAD_CELLS / heads) ** 0.5)
        raise SentenceError(
            f"the sentence has {n_tokens} tokens; with {heads} heads the toy variants take at most {most} "
            f"(every head's n × n steps are kept: heads × tokens² at most {MAX_HEAD_CELLS}), in every format"
        )


def check_inputs(config: ExplainConfig) -> None:
    """What ``build_trace`` checks before it loads or computes anything: with a model the sentence
    is not empty (its tokens are the model's); without, ``check_toy_inputs``."""
    if config.model is None:
        check_toy_inputs(config)
    elif config.sentence is not None:
        tokenize(config.sentence)  # refuses an empty sentence, as the model's tokenizer would


def check_toy_inputs(config: ExplainConfig) -> tuple[list[str], int]:
    """The toy variants' checks of the sentence, the query and the embedding options, before X is built.

    In ``build_trace``'s order: the sentence is not empty and fits (``check_length``), the
    query is one of its tokens or positions, an embeddings file is there with a known
    extension (or the seed's table has every token, with --embed seed), and RoPE gets an even width of at least 2 where the options alone decide
    the width (a file's vectors decide it once read, and ``check_rope_width`` runs then).

    Args:
        config: a config without a model.

    Returns:
        (the tokens, the query's position from 0).

    Raises:
        SentenceError: the sentence is empty or too long.
        QueryError: the query picks no token.
        EmbeddingError: the embeddings file is missing, a folder, or of an unknown kind.
        OptionError: RoPE would turn an odd width, or a width below 2.
    """
    tokens = config.tokens
    check_length(len(tokens), config.query_heads)
    query = find_query(tokens, config.query)  # a negative position counts from the end
    if config.embeddings is not None:
        check_embedding_path(config.embeddings)
    elif config.embed == "seed":
        check_table_has(tokens, SEED_TABLE)
    width = embedding_width(config.embed, config.embeddings, config.dim)
    if width is not None:
        check_rope_width(config, width)
    return tokens, query


def toy_d_k(config: ExplainConfig, d: int) -> int:
    """The width of each head's queries and keys for embeddings of width ``d``: --d-k, or the variant's default."""
    return config.d_k or (default_d_k(d, config.query_heads, config.positional) if config.variant in PROJECTED else d)


def check_rope_width(config: ExplainConfig, d: int) -> None:
    """OptionError when RoPE would turn an odd query/key width (with projections) or one below 2."""
    if config.positional != "rope":
        return
    d_k = toy_d_k(config, d)
    # Without projections an odd width turns its leading pairs and leaves the last feature.
    if config.variant in PROJECTED and d_k % 2:
        raise OptionError(f"RoPE turns pairs of features, so it needs an even width; this one is {d_k} (give an even --d-k)")
    if d_k < 2:
        raise OptionError(f"RoPE turns pairs of features, so it needs a width of at least 2; this one is {d_k} (give --dim 2 or more)")
