"""``build_trace``: from an ``ExplainConfig`` to the record every renderer reads.

The one place a sentence becomes a trace for the commands: the record (``AttentionTrace``)
of the seed, of a variant, or of a model's layer and head (the model loads once per
process, here and nowhere below).
"""

from __future__ import annotations

from selfattn.commands.explain_options import ExplainConfig, check_rope_width, check_toy_inputs, toy_d_k
from selfattn.pipeline.embedding_options import SEED_SENTENCE
from selfattn.pipeline.embeddings import resolve_embeddings
from selfattn.trace.record import AttentionTrace
from selfattn.trace.seed import trace_self_attention
from selfattn.trace.variant_names import PROJECTED
from selfattn.trace.variants import trace_variant


def build_trace(config: ExplainConfig, model=None) -> AttentionTrace:
    """Tokens -> embeddings -> attention, with every intermediate recorded.

    The seed's variant ("simple") without positional encoding gives the seed's own
    record (with its "seed" section); every other combination a variant's; a pretrained
    model its layer's and head's (the model loads once per process).

    Args:
        config: what to explain.
        model: with ``config.model``, that model already loaded (the live app holds its
            own); None: loaded here, once per process.

    Returns:
        The record for the renderers (``AttentionTrace``).

    Raises:
        SentenceError: the sentence is empty or longer than the positions: without a
            model 512 tokens (``MAX_TOKENS``; fewer with more than 4 heads, heads x
            tokens² at most ``MAX_HEAD_CELLS``), with one the model's own; in every format.
        QueryError: the query is not a token of the sentence, or a position out of range
            (-n to n - 1: a negative one counts from the end).
        EmbeddingError: the embeddings cannot be built for these tokens or their dot
            products overflow.
        OptionError: RoPE meets an odd d_k, or (with a model) the layer or head is out
            of range.
        ModelError: the model is not installed or its files do not fit.

    Examples:
        >>> import selfattn as sa
        >>> trace = sa.build_trace(sa.ExplainConfig())  # the seed, query "cat"
        >>> type(trace).__name__, trace.query.token, list(trace.sections)
        ('AttentionTrace', 'cat', ['inputs', 'seed'])
        >>> trace.steps.context[0, 1].round(decimals=4)  # the one head's context vector of "cat"
        tensor([0.4964, 0.6149, 0.5813])
        >>> trace = sa.build_trace(sa.ExplainConfig(variant="multihead"))
        >>> trace.n_heads, tuple(trace.steps.weights.shape)
        (2, (2, 7, 7))
    """
    if config.model is not None:
        # Imported with the first model: explain's start-up without one skips the loaders.
        from selfattn.models.loading import shared_model
        from selfattn.trace.model_trace import trace_model

        return trace_model(
            SEED_SENTENCE if config.sentence is None else config.sentence,
            shared_model(config.model, config.model_key) if model is None else model,
            layer=0 if config.layer is None else config.layer,
            head=0 if config.head is None else config.head,
            query=config.query,
            source=config.model,
        )
    tokens, query = check_toy_inputs(config)  # the trace records the query's position from 0
    x, source = resolve_embeddings(
        tokens, config.embed, path=config.embeddings, dim=config.dim, seed=config.seed
    )
    if config.variant == "simple" and config.positional == "none":
        return trace_self_attention(tokens, x, query, source)
    d = int(x.shape[1])
    check_rope_width(config, d)  # a file's vectors decide the width only now
    d_k = toy_d_k(config, d)
    return trace_variant(
        tokens,
        x,
        config.variant,
        query=query,
        heads=config.query_heads,
        kv_heads=config.key_value_heads,
        d_k=d_k if config.variant in PROJECTED else None,
        positional=config.positional,
        seed=config.seed,
        source=source,
        block_size=config.block_size,
    )
