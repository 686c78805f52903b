"""One JSON writer for every record: each section writes its keys, in the record's order.

The seed's record (inputs, seed), a variant's (inputs, positional, projections, scaling,
mask, multihead, flash, variant) and a model's (model) all go through ``render_json``;
which keys appear, and where, follows from the sections the record holds. Numbers are
full precision; JSON has no infinity or NaN, so those are written as the strings "inf",
"-inf" and "nan". Stable keys of the seed's output (later features add keys, these stay):
tokens, embeddings, query {index, token, scores, exp, exp_sum, weights, plain_division,
context}, scores, weights, context.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

from selfattn.render.text.variant_json import (
    flash_json,
    mask_json,
    multihead_json,
    positional_json,
    projections_json,
    scaling_json,
    variant_rows_json,
)
from selfattn.formatting import compact_json, plain
from selfattn.trace.record import AttentionTrace, record_of


def inputs_json(record: AttentionTrace) -> dict[str, Any]:
    """A toy run's variant, tokens, embeddings and where they came from."""
    inputs = record.sections["inputs"]
    return {"variant": inputs.variant, "tokens": record.tokens, "embeddings": record.embeddings,
            "embedding_source": asdict(inputs.source)}


def seed_json(record: AttentionTrace) -> dict[str, Any]:
    """The seed's walk of its query, then its whole score, weight and context matrices."""
    qt, head = record.sections["seed"], record.steps  # the seed has one layer and one head
    return {
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
        "scores": head.scores[0],
        "weights": head.weights[0],
        "row_sums": head.weights[0].sum(dim=-1),
        "context": head.context[0],
    }


def model_section_json(record: AttentionTrace) -> dict[str, Any]:
    """A model's whole layout (``model_json``, imported with the first model: the toy runs' start-up skips it)."""
    from selfattn.render.text.model_json import model_json

    return model_json(record)


SECTION_JSON: dict[str, Callable[[AttentionTrace], dict[str, Any]]] = {
    "inputs": inputs_json,
    "seed": seed_json,
    "positional": positional_json,
    "projections": projections_json,
    "scaling": scaling_json,
    "mask": mask_json,
    "multihead": multihead_json,
    "flash": flash_json,
    "variant": variant_rows_json,
    "model": model_section_json,
}
"""Section name -> the function that writes its keys: a new section is one function here."""


def trace_to_dict(trace) -> dict[str, Any]:
    """The record (or a view of it) as plain data: every section's keys, in the record's order."""
    record = record_of(trace)
    out: dict[str, Any] = {}
    for name in record.sections:
        out.update(SECTION_JSON[name](record))
    return plain(out)


def render_json(trace) -> str:
    """The record (or a view of it) as one JSON document, each row of numbers on one line."""
    return compact_json(trace_to_dict(trace), 0) + "\n"
