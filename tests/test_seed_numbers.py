"""Every number the seed prints, reproduced at its 4 decimals by the library and the CLI."""

import json

import pytest
import torch

from seed_reference import (
    ALL_SCORES,
    CAT_CONTEXT,
    CAT_EXP,
    CAT_EXP_SUM,
    CAT_SCORES,
    CAT_WEIGHTS,
    CAT_WEIGHTS_SUM,
    INPUTS,
    QUERY,
    QUERY_INDEX,
    ROW_SUMS,
    SENTENCE,
    TOKENS,
    at_4_decimals,
)
from selfattn import (
    SEED_SENTENCE,
    attention_scores,
    attention_scores_loop,
    context_vector_loop,
    context_vectors,
    seed_embeddings,
    self_attention,
    softmax,
    softmax_naive,
    tokenize,
    trace_self_attention,
)


def test_tokens_and_embeddings_are_the_seeds():
    assert SEED_SENTENCE == SENTENCE
    assert tokenize(SENTENCE) == TOKENS
    x = seed_embeddings(TOKENS)
    assert x.shape == (7, 3) and x.dtype == torch.float32
    torch.testing.assert_close(x, torch.tensor(INPUTS), rtol=0, atol=0)
    torch.testing.assert_close(x[QUERY_INDEX], torch.tensor(QUERY), rtol=0, atol=0)


def test_step_functions_reproduce_the_query_numbers(seed_x):
    query = seed_x[QUERY_INDEX]
    scores = attention_scores(query, seed_x)
    assert at_4_decimals(scores.tolist()) == CAT_SCORES
    assert at_4_decimals(attention_scores_loop(query, seed_x).tolist()) == CAT_SCORES
    exp = torch.exp(scores)
    assert at_4_decimals(exp.tolist()) == CAT_EXP
    assert at_4_decimals(exp.sum()) == CAT_EXP_SUM
    for weights in (softmax(scores), softmax_naive(scores)):
        assert at_4_decimals(weights.tolist()) == CAT_WEIGHTS
        assert at_4_decimals(weights.sum()) == CAT_WEIGHTS_SUM
        assert at_4_decimals(context_vectors(weights, seed_x).tolist()) == CAT_CONTEXT
        assert at_4_decimals(context_vector_loop(weights, seed_x).tolist()) == CAT_CONTEXT


def test_matrix_form_reproduces_the_full_tables(seed_x):
    scores = attention_scores(seed_x, seed_x)
    assert at_4_decimals(scores.tolist()) == ALL_SCORES
    weights = softmax(scores)
    assert at_4_decimals(weights.sum(-1).tolist()) == ROW_SUMS
    z = self_attention(seed_x)
    assert at_4_decimals(z[QUERY_INDEX].tolist()) == CAT_CONTEXT
    torch.testing.assert_close(z, context_vectors(weights, seed_x))


def test_trace_holds_the_seed_numbers(seed_x):
    trace = trace_self_attention(TOKENS, seed_x, "cat")
    q = trace.sections["seed"]
    assert (q.index, q.token) == (1, "cat")
    assert at_4_decimals(q.scores.tolist()) == CAT_SCORES
    assert at_4_decimals(q.scores_loop.tolist()) == CAT_SCORES
    assert at_4_decimals(q.exp.tolist()) == CAT_EXP
    assert at_4_decimals(q.exp_sum) == CAT_EXP_SUM
    assert at_4_decimals(q.weights.tolist()) == CAT_WEIGHTS
    assert at_4_decimals(q.context.tolist()) == CAT_CONTEXT
    assert at_4_decimals(trace.steps.scores[0].tolist()) == ALL_SCORES
    assert at_4_decimals(trace.steps.weights[0].sum(dim=-1).tolist()) == ROW_SUMS
    assert not q.naive_overflows


def test_cli_json_reproduces_the_seed(run_cli):
    status, out, err = run_cli("explain", "--format", "json")
    assert status == 0 and err == ""
    data = json.loads(out)
    assert data["tokens"] == TOKENS
    assert at_4_decimals(data["embeddings"]) == INPUTS
    query = data["query"]
    assert query["index"] == QUERY_INDEX and query["token"] == "cat"
    assert at_4_decimals(query["scores"]) == CAT_SCORES
    assert at_4_decimals(query["exp"]) == CAT_EXP
    assert at_4_decimals(query["exp_sum"]) == CAT_EXP_SUM
    assert at_4_decimals(query["weights"]) == CAT_WEIGHTS
    assert at_4_decimals(query["context"]) == CAT_CONTEXT
    assert at_4_decimals(data["scores"]) == ALL_SCORES
    assert at_4_decimals([sum(row) for row in data["weights"]]) == ROW_SUMS
    assert at_4_decimals(data["context"][QUERY_INDEX]) == CAT_CONTEXT
    # Full precision, not rounded: the JSON keeps more digits than the printout.
    assert query["exp_sum"] != CAT_EXP_SUM


def _formatted(values):
    return [f"{v:.4f}" for v in values]


def test_cli_text_prints_every_seed_number(run_cli):
    status, out, _ = run_cli("explain")
    assert status == 0
    expected = (
        _formatted(CAT_SCORES + CAT_EXP + CAT_WEIGHTS + CAT_CONTEXT + [CAT_EXP_SUM, CAT_WEIGHTS_SUM])
        + [f"{v:.4f}" for row in ALL_SCORES for v in row]
    )
    for number in expected:
        assert number in out, number
    assert "ω = [0.6682, 1.3581, 1.2746, 0.7640, 0.6660, 1.0855, 1.3341]" in out
    assert "z^(2) = [0.4964, 0.6149, 0.5813]" in out
    assert "sum of exp(ω) = 20.2676" in out
    # The 7x7 score table row for "cat" is printed in order.
    assert "cat        0.6682   1.3581   1.2746   0.7640   0.6660   1.0855   1.3341" in out


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda sa, x: sa.trace_variant(TOKENS, x, "bogus"), "OptionError", "unknown variant 'bogus'"),
        (lambda sa, x: sa.trace_variant(TOKENS, x, "qkv", positional="spiral"), "OptionError", "unknown positional encoding"),
        (lambda sa, x: sa.trace_variant(TOKENS, x[:5], "scaled"), "EmbeddingError", "5 rows but the sentence has 7 tokens"),
        (lambda sa, x: sa.trace_self_attention(TOKENS, x[:, None]), "EmbeddingError", "must be 2-D"),
        (lambda sa, x: sa.trace_self_attention(TOKENS, x.tolist()), "EmbeddingError", "must be a tensor"),
    ],
)
def test_traces_refuse_unknown_names_and_embeddings_that_do_not_fit(seed_x, call, error, match):
    """A name that does not exist is an error, never another variant run silently."""
    import selfattn as sa

    with pytest.raises(getattr(sa, error), match=match):
        call(sa, seed_x)
