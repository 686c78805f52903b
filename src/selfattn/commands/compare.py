"""``compare``: where a query token looks in two sentences, head by head, built as ``explain`` builds each.

The sentences run on their own (``build_trace``), the query found in each; the model, when
there is one, loads here once. ``analysis.comparison`` turns the two traces into a
``Comparison``; ``explain.compare_render`` writes it.
"""

from __future__ import annotations

import dataclasses

import torch

from selfattn.analysis.comparison import Comparison, compare_traces
from selfattn.analysis.inputs import COMPARED
from selfattn.commands.compare_options import about, check_compare, locate_query
from selfattn.commands.traces import build_trace
from selfattn.models.loading import shared_model
from selfattn.models.queries import model_finder, model_query_piece
from selfattn.pipeline.tokenize import read_position


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
    configs, indices = check_compare(sentence_a, sentence_b, query, model, **options)
    sentences = (sentence_a, sentence_b)
    if model is None:
        loaded = None
    else:
        loaded = shared_model(model)
        tokens, readable = [], []
        for label, sentence in zip(COMPARED, sentences):
            with about(label):
                encoded = loaded.tokenize(sentence)
            tokens.append(encoded.tokens[0])
            readable.append(loaded.tokenizer.readable(encoded.input_ids[0].tolist()))
        piece = query
        if isinstance(query, str) and read_position(query) is None:
            piece = model_query_piece(query, tokens, readable, loaded)
        indices = [locate_query(t, piece, label, model_finder(r, loaded), query, r)
                   for t, r, label in zip(tokens, readable, COMPARED)]
    traces = []
    for config, index, label in zip(configs, indices, COMPARED):
        with about(label):
            traces.append(build_trace(dataclasses.replace(config, query=index)))
    causal = model is None or traces[0].sections["model"].infos[traces[0].layer].causal
    similarity = None if causal else _sentence_similarity(loaded, sentences)
    return compare_traces(sentences, traces, indices, model, similarity)


def _sentence_similarity(model, sentences) -> float:
    """e_A . e_B for the embeddings ``BertModel.encode`` makes of both at once, as `selfattn similarity` does."""
    with torch.no_grad():
        embeddings = model.encode(list(sentences)).to(torch.float64)  # (2, d), each of length 1
    return float(embeddings[0] @ embeddings[1])
