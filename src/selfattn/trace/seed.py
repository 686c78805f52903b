"""The seed's self-attention, traced: every intermediate of Z = softmax(X X^T) X, and one query's walk.

``trace_self_attention`` calls the pipeline's step functions once and fills the one
record (``AttentionTrace``): one layer, one head whose queries, keys and values are X
itself, and the seed's own walk of the query (``QueryTrace``: the terms, the loops, the
naive and stable softmax, plain division) as its "seed" section, and returns it.
``Trace`` is the record's old name here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfattn.errors import EmbeddingError
from selfattn.pipeline.embeddings import EmbeddingSource, check_matrix
from selfattn.pipeline.steps import (
    attention_scores,
    attention_scores_loop,
    context_vector_loop,
    context_vectors,
    plain_division,
    softmax_parts,
)
from selfattn.pipeline.tokenize import find_query
from selfattn.trace.record import AttentionTrace, Inputs, LayerSteps, Query


@dataclass(frozen=True)
class QueryTrace:
    """One query token's walk through scores, softmax and context (the seed's steps 3-5).

    n is the number of tokens and d the embedding width. Both softmax forms are kept:
    the naive one to show where it overflows, the stable one for the weights.

    Attributes:
        index: the query's 0-based position in the sentence (the maths calls it index + 1).
        token: the query token, ``tokens[index]``.
        terms: (n, d), x_q[k] * x_j[k]: the terms of each dot product, before summing.
        scores_loop: (n,), omega_j from one dot product at a time.
        scores: (n,), omega = X x_q as one matrix-vector product.
        exp: (n,), exp(omega) in the naive form; may hold inf.
        exp_sum: (), sum_j exp(omega_j) in the naive form; may be inf.
        weights_naive: (n,), exp / exp_sum; NaN where the naive form overflowed.
        max: (), m = max_j omega_j, the stable form's shift.
        shifted: (n,), omega - m.
        exp_shifted: (n,), exp(omega - m); the largest is 1.
        exp_shifted_sum: (), sum_j exp(omega_j - m).
        weights: (n,), alpha from the stable form; sums to 1.
        scores_sum: (), sum_j omega_j, the denominator of plain division.
        plain_division: (n,), omega_j / sum omega: what dividing by the sum, without
            softmax's exponential, would give; inf, -inf or NaN where the sum is 0.
        context_terms: (n, d), alpha_j * x_j: the terms of the context vector.
        context_loop: (d,), z from a running sum over the tokens.
        context: (d,), z = alpha X as one product.
    """

    index: int  # 0-based position in the code; the maths calls it index + 1
    token: str
    terms: torch.Tensor  # (n, d): x_q[k] * x_j[k], the terms of each dot product
    scores_loop: torch.Tensor  # (n,): omega_j from one dot product at a time
    scores: torch.Tensor  # (n,): omega = X x_q as one matrix-vector product
    exp: torch.Tensor  # (n,): exp(omega), the naive form (may hold inf)
    exp_sum: torch.Tensor  # (): sum_j exp(omega_j) (may be inf)
    weights_naive: torch.Tensor  # (n,): exp / exp_sum (NaN where it overflowed)
    max: torch.Tensor  # (): m = max_j omega_j, the stable form's shift
    shifted: torch.Tensor  # (n,): omega - m
    exp_shifted: torch.Tensor  # (n,): exp(omega - m)
    exp_shifted_sum: torch.Tensor  # ()
    weights: torch.Tensor  # (n,): alpha, from the stable form
    scores_sum: torch.Tensor  # (): sum_j omega_j
    plain_division: torch.Tensor  # (n,): omega_j / sum omega, softmax's naive rival
    context_terms: torch.Tensor  # (n, d): alpha_j * x_j
    context_loop: torch.Tensor  # (d,): z from a running sum
    context: torch.Tensor  # (d,): z = alpha X as one product

    @property
    def naive_overflows(self) -> bool:
        """True when the naive softmax gives inf or NaN on these scores."""
        return not bool(torch.isfinite(self.weights_naive).all())

    @property
    def plain_division_fails(self) -> list[str]:
        """Why omega / sum omega gives no weights here: "zero sum", "negative weight", "negative sum" (empty if it works).

        A zero sum divides by zero; a weight below 0 is no share of anything; a negative
        sum reverses the order, so the smallest score gets the largest weight.
        """
        total = float(self.scores_sum)
        if total == 0:
            return ["zero sum"]
        reasons = ["negative weight"] if bool((self.plain_division < 0).any()) else []
        return reasons + (["negative sum"] if total < 0 else [])

    @property
    def scores_loop_vs_matrix(self) -> float:
        """Largest absolute difference between the loop and the matrix-product scores."""
        return float((self.scores_loop - self.scores).abs().max())

    @property
    def naive_vs_stable(self) -> float:
        """Largest absolute difference between the naive and the stable weights (NaN if the naive form overflowed)."""
        return float((self.weights_naive - self.weights).abs().max())

    @property
    def context_loop_vs_matrix(self) -> float:
        """Largest absolute difference between the running-sum and the matrix-product context vector."""
        return float((self.context_loop - self.context).abs().max())


Trace = AttentionTrace
"""The old name of what ``trace_self_attention`` returns (it was a view of the record; now the record itself)."""


def check_dot_products(scores: torch.Tensor, x: torch.Tensor) -> None:
    """Refuse embeddings whose dot products (the scores X X^T) overflow their dtype."""
    if not torch.isfinite(scores).all():
        # Finite vectors can still have dot products beyond float32's range (|x| ~ 1e20).
        raise EmbeddingError(
            f"the dot products of these embeddings overflow {str(x.dtype).removeprefix('torch.')} "
            f"(largest |x| is {float(x.abs().max()):.3g}): scale the vectors down"
        )


def trace_self_attention(
    tokens: list[str],
    embeddings: torch.Tensor,
    query: str | int | None = None,
    source: EmbeddingSource | None = None,
) -> AttentionTrace:
    """Run the seed's self-attention on X (n, d) and record every intermediate.   n tokens, (n, d) -> AttentionTrace

    Z = softmax(X X^T) X, unscaled, computed once with the pipeline's step functions
    for the whole sentence and once step by step (loops, naive and stable softmax) for
    the query. X is detached: the trace holds no autograd graph.

    Args:
        tokens: the n tokens, in sentence order.
        embeddings: X, (n, d), one row per token.
        query: the query token, as the token itself (case-sensitive; its first
            occurrence if repeated) or a 0-based position (int, or a string of digits
            that is not a token). None: position 1, as the seed picks "cat" (position 0
            for a one-token sentence).
        source: where X came from, recorded in the trace. None: "given by the caller".

    Returns:
        The record (``AttentionTrace``): one layer with one head (``trace.steps``: X Xᵀ
            in ``scores``, the weights, the context), and the query's own walk in
            ``trace.sections["seed"]`` (``QueryTrace``).

    Raises:
        QueryError: ``query`` is not a token of the sentence or its position is out of range.
        EmbeddingError: the dot products X X^T overflow the dtype of X.

    Examples:
        >>> import selfattn as sa
        >>> tokens = sa.tokenize(sa.SEED_SENTENCE)
        >>> trace = sa.trace_self_attention(tokens, sa.seed_embeddings(tokens), query="cat")
        >>> trace.query.index, trace.query.token
        (1, 'cat')
        >>> walk = trace.sections["seed"]  # the query's own steps
        >>> walk.weights.round(decimals=4)
        tensor([0.0962, 0.1919, 0.1765, 0.1059, 0.0960, 0.1461, 0.1873])
        >>> walk.context.round(decimals=4)
        tensor([0.4964, 0.6149, 0.5813])
        >>> trace.steps.weights.shape  # every query: one head of 7 x 7
        torch.Size([1, 7, 7])
    """
    x = check_matrix(tokens, embeddings).detach()
    q = find_query(tokens, query)
    all_scores = attention_scores(x, x)  # (n, n)
    check_dot_products(all_scores, x)
    x_q = x[q]  # (d,)

    scores = attention_scores(x_q, x)  # (n,)
    naive = softmax_parts(scores, stable=False)
    stable = softmax_parts(scores, stable=True)
    weights = stable.weights  # (n,)
    query_trace = QueryTrace(
        index=q,
        token=tokens[q],
        terms=x * x_q,  # (n, d) * (d,) -> (n, d)
        scores_loop=attention_scores_loop(x_q, x),
        scores=scores,
        exp=naive.exp,
        exp_sum=naive.total.squeeze(-1),
        weights_naive=naive.weights,
        max=stable.shift.squeeze(-1),
        shifted=stable.shifted,
        exp_shifted=stable.exp,
        exp_shifted_sum=stable.total.squeeze(-1),
        weights=weights,
        scores_sum=scores.sum(),
        plain_division=plain_division(scores),
        context_terms=weights[:, None] * x,  # (n, 1) * (n, d) -> (n, d)
        context_loop=context_vector_loop(weights, x),
        context=context_vectors(weights, x),
    )

    all_parts = softmax_parts(all_scores)
    all_weights = all_parts.weights  # (n, n)
    context = context_vectors(all_weights, x)  # (n, n) @ (n, d) -> (n, d)
    if source is None:
        source = EmbeddingSource("given", False, "given by the caller")
    # One head whose queries, keys and values are X itself, unscaled and unmasked: (1, n, ...) each.
    steps = LayerSteps(
        input=x, q=x[None], k=x[None], v=x[None], q_plain=None, k_plain=None, kv_head_of=(0,), scale=1.0,
        scores=all_scores[None], scaled=all_scores[None], masked=all_scores[None],
        row_max=all_parts.shift.squeeze(-1)[None], exp=all_parts.exp[None], exp_sum=all_parts.total.squeeze(-1)[None],
        weights=all_weights[None], context=context[None], output=context,
    )
    record = AttentionTrace(
        tokens=list(tokens), query=Query(q, tokens[q]), embeddings=x, layers=(steps,),
        sections={"inputs": Inputs("simple", source), "seed": query_trace},
    )
    return record
