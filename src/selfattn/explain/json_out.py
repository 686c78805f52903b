"""Render a Trace as one JSON object with full-precision numbers.

Stable keys (later features add keys, these stay): tokens, embeddings, query {index,
token, scores, exp, exp_sum, weights, plain_division, context}, scores, weights, context. JSON has no
infinity or NaN, so those are written as the strings "inf", "-inf" and "nan".
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from selfattn.formatting import compact_json, plain
from selfattn.trace.seed import Trace
from selfattn.trace.variants import VariantTrace

if TYPE_CHECKING:
    from selfattn.trace.model import ModelTrace


def trace_to_dict(trace: Trace) -> dict[str, Any]:
    qt = trace.query
    return plain(
        {
            "variant": "simple",
            "tokens": trace.tokens,
            "embeddings": trace.embeddings,
            "embedding_source": asdict(trace.source),
            "query": {
                "index": qt.index,
                "math_index": qt.index + 1,
                "token": qt.token,
                "scores": qt.scores,
                "scores_loop": qt.scores_loop,
                "exp": qt.exp,
                "exp_sum": float(qt.exp_sum),
                "weights": qt.weights,
                "weights_naive": qt.weights_naive,
                "naive_overflow": qt.naive_overflows,
                "scores_sum": float(qt.scores_sum),
                "plain_division": qt.plain_division,
                "plain_division_fails": qt.plain_division_fails,
                "stable": {
                    "max": float(qt.max),
                    "shifted": qt.shifted,
                    "exp": qt.exp_shifted,
                    "exp_sum": float(qt.exp_shifted_sum),
                },
                "context": qt.context,
                "context_loop": qt.context_loop,
            },
            "scores": trace.scores,
            "weights": trace.weights,
            "row_sums": trace.row_sums,
            "context": trace.context,
        }
    )


def render_json(trace: Trace | VariantTrace | ModelTrace) -> str:
    if isinstance(trace, VariantTrace):
        from selfattn.explain.variant_json import variant_to_dict

        return compact_json(variant_to_dict(trace), 0) + "\n"
    if isinstance(trace, Trace):
        return compact_json(trace_to_dict(trace), 0) + "\n"
    # A pretrained model's ModelTrace: its module is imported only when a model runs.
    from selfattn.explain.model_json import model_to_dict

    return compact_json(model_to_dict(trace), 0) + "\n"
