"""``compare``: where a query token looks in two sentences, head by head, built as ``explain`` builds each.

The sentences run on their own (``build_trace``), the query found in each; the model, when
there is one, loads here once. ``analysis.comparison`` turns the two traces into a
``Comparison``; ``explain.compare_render`` writes it.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch

from selfattn.analysis.comparison import LABELS, OPTIONS, Comparison, compare_traces
from selfattn.commands.options import ExplainConfig
from selfattn.commands.traces import build_trace
from selfattn.errors import EmbeddingError, OptionError, QueryError, SentenceError
from selfattn.models.loading import shared_model
from selfattn.models.queries import model_finder, model_query_piece
from selfattn.pipeline.embeddings import SEED_TABLE
from selfattn.pipeline.tokenize import check_text, find_query, missing_tokens, quote_tokens, read_position


def compare(sentence_a: str, sentence_b: str, query: str | int, model: str | None = None, **options) -> Comparison:
    """Where a query token looks in two sentences, head by head, and (for a model) how its vector differs.

    Each sentence runs on its own, as ``selfattn explain`` runs it, so every number
    equals that of ``explain --format json`` on the same sentence. For the toy variants
    the two sentences share one embedding table (the seed's when it knows every token of
    both, else random) and one set of untrained weights (``seed``).

    Args:
        sentence_a: the first sentence.
        sentence_b: the second sentence.
        query: the query, found in each sentence on its own: a token (case-sensitive for
            the toy variants; for a model one of its tokens as written ('Ġcat') or as it
            reads ('cat'), in any case when nothing matches exactly) picks its first
            occurrence, and a 0-based position (an int, or a string of digits that is
            not a token of that sentence) picks that position in both; a negative one
            counts from the end of each (-1: each sentence's last token). A model's special
            tokens count ([CLS] or <s> is 0), and a word the model cuts into several
            pieces is refused with the pieces named: give one of them.
        model: a pretrained model ("all-MiniLM-L6-v2", or a folder of any supported
            family); None: the toy variants.
        **options: the toy variants' inputs, as ``ExplainConfig`` fields: embeddings,
            embed, dim, seed, variant, heads, kv_heads, d_k, positional, block_size.
            With a model they must keep their defaults.

    Returns:
        The ``Comparison``: the query's top three keys and row entropy in every head of
            both sentences; for a model also the query's cosine after each layer and (for
            an encoder) the sentence similarity.

    Raises:
        OptionError: an unknown option, or options that do not combine (see ``ExplainConfig``).
        SentenceError: a sentence is empty or too long; the message names which.
        QueryError: the query is not in a sentence (the message names which), is out of
            range, or is a word the model splits into pieces.
        EmbeddingError: the embeddings cannot be built for a sentence's tokens.
        ModelError: the model is not installed.

    Examples:
        >>> import selfattn as sa
        >>> c = sa.compare("The cat sat on the mat", "the warm cat sat", "cat")  # the seed's vectors
        >>> c.index_a, c.index_b, c.n_layers, c.n_heads
        (1, 2, 1, 1)
        >>> [(t.token, round(t.weight, 3)) for t in c.heads[0].top_a]
        [('cat', 0.225), ('mat', 0.219), ('sat', 0.207)]
        >>> [(t.token, round(t.weight, 3)) for t in c.heads[0].top_b]
        [('cat', 0.314), ('sat', 0.289), ('warm', 0.239)]
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise OptionError(f"compare does not take {', '.join(unknown)}: its options are {', '.join(OPTIONS)}")
    if query is None:
        raise QueryError("give the query to compare: a token of both sentences or a 0-based position")
    if isinstance(query, str):
        check_text(query, "the query", QueryError)
    sentences = (sentence_a, sentence_b)
    for label, sentence in zip(LABELS, sentences):
        if not isinstance(sentence, str) or not sentence.strip():
            raise SentenceError(f"sentence {label} is empty: give at least one word")
    configs = [ExplainConfig(sentence=s, model=model, format="json", **options) for s in sentences]
    if model is None:
        configs = _shared_embeddings(configs)
        tokens = [config.tokens for config in configs]
        indices = [_locate(t, query, label, find_query, query) for t, label in zip(tokens, LABELS)]
        loaded = None
    else:
        loaded = shared_model(model)
        tokens, readable = [], []
        for label, sentence in zip(LABELS, sentences):
            with _about(label):
                encoded = loaded.tokenize(sentence)
            tokens.append(encoded.tokens[0])
            readable.append(loaded.tokenizer.readable(encoded.input_ids[0].tolist()))
        piece = query
        if isinstance(query, str) and read_position(query) is None:
            piece = model_query_piece(query, tokens, readable, loaded)
        indices = [_locate(t, piece, label, model_finder(r, loaded), query, r)
                   for t, r, label in zip(tokens, readable, LABELS)]
    traces = []
    for config, index, label in zip(configs, indices, LABELS):
        with _about(label):
            traces.append(build_trace(dataclasses.replace(config, query=index)))
    causal = model is None or traces[0].attention.causal
    similarity = None if causal else _sentence_similarity(loaded, sentences)
    return compare_traces(sentences, traces, indices, model, similarity)


def _sentence_similarity(model, sentences) -> float:
    """e_A . e_B for the embeddings ``BertModel.encode`` makes of both at once, as `selfattn similarity` does."""
    with torch.no_grad():
        embeddings = model.encode(list(sentences)).to(torch.float64)  # (2, d), each of length 1
    return float(embeddings[0] @ embeddings[1])


def _shared_embeddings(configs: list[ExplainConfig]) -> list[ExplainConfig]:
    """One table for both sentences: "auto" would pick the seed's for one and random vectors for the other."""
    first = configs[0]
    if first.embed != "auto" or first.embeddings is not None or first.dim is not None:
        return configs
    every_token = first.tokens + configs[1].tokens
    method = "random" if missing_tokens(every_token, SEED_TABLE) else "seed"
    return [dataclasses.replace(config, embed=method) for config in configs]


def _locate(tokens: list[str], query: str | int, label: str, find, shown: str | int,
            readable: list[str] | None = None) -> int:
    """The query's position in one sentence; a query that is not there names the sentence (and ``shown``, as given)."""
    try:
        return find(tokens, query)
    except QueryError as error:
        if isinstance(query, str) and read_position(query) is None:
            listed = tokens if readable is None else [r.strip() or t for t, r in zip(tokens, readable)]
            case = "case-sensitive" if readable is None else "as they read, in any case"
            raise QueryError(
                f"the query {shown!r} is not in sentence {label}: its tokens are "
                f"{quote_tokens(listed, 12, count=True)} ({case}); give one of them or a 0-based position"
            ) from None
        raise QueryError(f"sentence {label}: {error}") from None


@contextmanager
def _about(label: str):
    """Prefixes an error about one sentence with which it is: "sentence B: ..."."""
    try:
        yield
    except (SentenceError, EmbeddingError) as error:
        raise type(error)(f"sentence {label}: {error}") from None
