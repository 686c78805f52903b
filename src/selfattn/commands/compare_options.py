"""What ``compare`` checks before a model loads or a trace is built.

Its options, the query, both sentences and their ``ExplainConfig``; for the toy variants
also the one embedding table both share, the query's position in each, and each
sentence's own checks (``check_toy_inputs``). Plain Python, no torch: ``compare`` calls it
first, and the command line calls it before torch loads, so a bad argument is one line at once.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

from selfattn.analysis.inputs import COMPARE_OPTIONS, COMPARED
from selfattn.commands.explain_options import ExplainConfig, check_toy_inputs
from selfattn.errors import EmbeddingError, OptionError, QueryError, SentenceError
from selfattn.pipeline.embedding_options import SEED_TABLE
from selfattn.pipeline.tokenize import check_text, find_query, missing_tokens, quote_tokens, read_position


def check_compare(sentence_a: str, sentence_b: str, query, model=None, **options) -> tuple[list[ExplainConfig], list[int] | None]:
    """The two sentences' configs, and for the toy variants the query's position in each (None with a model).

    Raises:
        OptionError: an unknown option, or options that do not combine (``ExplainConfig``).
        SentenceError: a sentence is empty (or, toy, too long); the message names which.
        QueryError: no query, or (toy) a query that is not in a sentence or out of range.
        EmbeddingError: (toy) an embeddings file that is not there, or a token the seed's table lacks.
        ModelError: the model is not there.
    """
    unknown = sorted(set(options) - set(COMPARE_OPTIONS))
    if unknown:
        raise OptionError(f"compare does not take {', '.join(unknown)}: its options are {', '.join(COMPARE_OPTIONS)}")
    if query is None:
        raise QueryError("give the query to compare: a token of both sentences or a 0-based position")
    if isinstance(query, str):
        check_text(query, "the query", QueryError)
    sentences = (sentence_a, sentence_b)
    for label, sentence in zip(COMPARED, sentences):
        if not isinstance(sentence, str) or not sentence.strip():
            raise SentenceError(f"sentence {label} is empty: give at least one word")
    configs = [ExplainConfig(sentence=s, model=model, format="json", **options) for s in sentences]
    if model is not None:
        return configs, None
    configs = shared_embeddings(configs)
    indices = [locate_query(config.tokens, query, label, find_query, query) for config, label in zip(configs, COMPARED)]
    configs = [dataclasses.replace(config, query=index) for config, index in zip(configs, indices)]
    for config, label in zip(configs, COMPARED):
        with about(label):
            check_toy_inputs(config)
    return configs, indices


def shared_embeddings(configs: list[ExplainConfig]) -> list[ExplainConfig]:
    """One table for both sentences: "auto" would pick the seed's for one and random vectors for the other."""
    first = configs[0]
    if first.embed != "auto" or first.embeddings is not None or first.dim is not None:
        return configs
    every_token = first.tokens + configs[1].tokens
    method = "random" if missing_tokens(every_token, SEED_TABLE) else "seed"
    return [dataclasses.replace(config, embed=method) for config in configs]


def locate_query(tokens: list[str], query: str | int, label: str, find, shown: str | int,
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
def about(label: str):
    """Prefixes an error about one sentence with which it is: "sentence B: ..."."""
    try:
        yield
    except (SentenceError, EmbeddingError) as error:
        raise type(error)(f"sentence {label}: {error}") from None
