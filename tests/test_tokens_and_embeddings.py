"""Tokens, query selection and the built-in embedding tables."""

import pytest
import torch

from seed_reference import INPUTS, TOKENS
from selfattn import EmbeddingError, OptionError, QueryError, SentenceError, embed, random_embeddings, tokenize
from selfattn.pipeline.embeddings import resolve_embeddings
from selfattn.pipeline.tokenize import find_query


@pytest.mark.parametrize(
    "sentence,tokens",
    [("The cat", ["The", "cat"]), ("  a\tb\n c  ", ["a", "b", "c"]), ("mat.", ["mat."]), ("Zürich 東京", ["Zürich", "東京"])],
)
def test_tokenize_splits_on_whitespace(sentence, tokens):
    assert tokenize(sentence) == tokens


@pytest.mark.parametrize("sentence", ["", "   ", "\n\t"])
def test_empty_sentence_is_refused(sentence):
    with pytest.raises(SentenceError, match="empty"):
        tokenize(sentence)


def test_query_by_token_position_and_default():
    assert find_query(TOKENS, None) == 1
    assert find_query(["solo"], None) == 0
    assert find_query(TOKENS, "cat") == 1
    assert find_query(TOKENS, "The") == 0
    assert find_query(TOKENS, "the") == 4  # case-sensitive
    assert find_query(TOKENS, "4") == 4  # a number that is not a token is a position
    assert find_query(TOKENS, 6) == 6
    assert find_query(["a", "a", "b"], "a") == 0  # first occurrence
    assert find_query(["1", "2", "3"], "1") == 0  # a token wins over a position
    assert find_query(TOKENS, -1) == len(TOKENS) - 1  # negative positions count from the end
    assert find_query(TOKENS, "-7") == 0
    assert find_query(["-1", "b"], "-1") == 0  # a token wins over a position from the end too


@pytest.mark.parametrize("query,match", [("dog", "'dog' is not in the sentence"), ("Cat", "not in the sentence"),
                                         ("7", "position 7 is out of range.*positions 0 to 6"),
                                         (-8, "position -8 is out of range.*or -7 to -1 from the end"),
                                         (99, "out of range")])
def test_bad_queries_are_refused(query, match):
    with pytest.raises(QueryError, match=match):
        find_query(TOKENS, query)


def test_embed_looks_up_rows_in_sentence_order():
    table = {"a": [1.0, 2.0], "b": [3.0, 4.0]}
    torch.testing.assert_close(embed(["b", "a", "b"], table), torch.tensor([[3.0, 4.0], [1.0, 2.0], [3.0, 4.0]]))
    with pytest.raises(EmbeddingError, match="no embedding for token 'c'"):
        embed(["a", "c"], table)
    with pytest.raises(EmbeddingError, match="3 rows but the sentence has 2 tokens"):
        embed(["a", "b"], torch.zeros(3, 2))
    with pytest.raises(EmbeddingError, match="one length"):
        embed(["a", "b"], {"a": [1.0], "b": [1.0, 2.0]})


def test_random_embeddings_are_per_token_and_reproducible():
    x = random_embeddings(["a", "b", "a"], dim=5, seed=7)
    assert x.shape == (3, 5) and x.dtype == torch.float32
    torch.testing.assert_close(x[0], x[2])  # one vector per token
    assert not torch.equal(x[0], x[1])
    # A token's vector depends on the token, seed and width only, not on its neighbours.
    torch.testing.assert_close(random_embeddings(["z", "b"], dim=5, seed=7)[1], x[1])
    assert not torch.equal(random_embeddings(["a"], dim=5, seed=8)[0], x[0])
    for dim in (0, 1025, 2.5, True):
        with pytest.raises(OptionError, match="--dim must be an integer from 1 to 1024"):
            random_embeddings(["a"], dim=dim)


def test_resolve_picks_the_seed_table_then_random():
    x, source = resolve_embeddings(TOKENS)
    assert source.kind == "seed" and not source.trained
    torch.testing.assert_close(x, torch.tensor(INPUTS))
    x, source = resolve_embeddings(["The", "mat"])
    assert source.kind == "seed"
    torch.testing.assert_close(x, torch.tensor([INPUTS[0], INPUTS[6]]))
    x, source = resolve_embeddings(["The", "dog"])
    assert source.kind == "random" and "'dog'" in source.note and x.shape == (2, 3)
    x, source = resolve_embeddings(TOKENS, dim=6, seed=2)
    assert source.kind == "random" and source.seed == 2 and x.shape == (7, 6)
    x, source = resolve_embeddings(TOKENS, "random")
    assert source.kind == "random" and "untrained" in source.description


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(method="seed", dim=5), "seed's table is 3-dimensional"),
        (dict(method="random", path="x.json"), "exclude each other"),
        (dict(path="x.json", dim=4), "--dim applies only to random"),
        (dict(method="learned"), "unknown embedding method"),
    ],
)
def test_resolve_refuses_conflicting_options(kwargs, match):
    with pytest.raises(OptionError, match=match):
        resolve_embeddings(TOKENS, **kwargs)


def test_seed_table_misses_unknown_tokens():
    with pytest.raises(EmbeddingError, match="'dog'"):
        resolve_embeddings(["The", "dog"], "seed")
