"""Render a Trace as one JSON object with full-precision numbers.

Stable keys (later features add keys, these stay): tokens, embeddings, query {index,
token, scores, exp, exp_sum, weights, plain_division, context}, scores, weights, context. JSON has no
infinity or NaN, so those are written as the strings "inf", "-inf" and "nan".
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

from selfattn.trace import Trace
from selfattn.variant_trace import VariantTrace

if TYPE_CHECKING:
    from selfattn.models.model_trace import ModelTrace


def plain(value: Any, precision: int | None = None) -> Any:
    """Tensors to nested lists of floats, non-finite floats to strings.

    With ``precision``, finite floats are rounded to that many decimals (and -0.0 becomes 0.0).
    """
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if precision is None:
            return value
        value = round(value, precision)
        return 0.0 if value == 0 else value  # no "-0.0"
    if isinstance(value, (list, tuple)):
        return [plain(v, precision) for v in value]
    if isinstance(value, dict):
        return {k: plain(v, precision) for k, v in value.items()}
    return value


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


def _compact(value: Any, indent: int) -> str:
    """json.dumps with nesting indented, but each list of numbers kept on one line."""
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f'{pad}  {json.dumps(k)}: {_compact(v, indent + 1)}' for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        rows = [f"{pad}  {_compact(v, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(rows) + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def render_json(trace: Trace | VariantTrace | ModelTrace) -> str:
    if isinstance(trace, VariantTrace):
        from selfattn.explain.variant_json import variant_to_dict

        return _compact(variant_to_dict(trace), 0) + "\n"
    if isinstance(trace, Trace):
        return _compact(trace_to_dict(trace), 0) + "\n"
    # A pretrained model's ModelTrace: its module is imported only when a model runs.
    from selfattn.explain.model_json import model_to_dict

    return _compact(model_to_dict(trace), 0) + "\n"
