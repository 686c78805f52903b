"""The old views' names on the record, for one release: ``trace.weights`` and the like, with a warning.

``trace_self_attention``, ``trace_variant`` and ``trace_model`` return the record itself
(``AttentionTrace``) now; they used to return views of it (``Trace``, ``VariantTrace``,
``ModelTrace``) whose properties gave its fields other names, and one name meant different
things in each (``scores`` was X Xᵀ in the seed's, scale * Q Kᵀ in a variant's and the
softmax's input in a model's). A name the record does not have is looked up here, by the
kind of record (a model's, the seed's, a variant's), read as the view read it and answered
with a DeprecationWarning that spells the reading out. Each entry is that spelling, with
``r`` for the record, so what the warning says is what runs. Goes with the next release.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch

from selfattn.trace.variant_names import UNSCALED

_STEP = {name: f"r.steps.{name}[r.head]" for name in ("row_max", "exp", "exp_sum", "weights", "context")}
_MODEL = {
    **{name: f"r.sections['model'].{name}" for name in (
        "model_name", "sentence", "readable", "special_tokens", "input_ids", "embedding", "hidden_states",
        "builtin", "weight_blocks", "default_model")},
    **_STEP,
    "model_source": "r.sections['model'].source",
    "d_model": "int(r.embeddings.shape[-1])",
    "d_head": "int(r.steps.q.shape[-1])",
    "query_index": "r.query.index",
    "query_token": "r.query.token",
    "attention": "r.sections['model'].infos[r.layer]",
    "layer_infos": "r.sections['model'].infos",
    "layer_input": "r.sections['model'].hidden_states[r.layer]",
    "layer_output": "r.sections['model'].hidden_states[r.layer + 1]",
    "attention_input": "r.steps.input",
    "kv_head": "r.steps.kv_head_of[r.head]",
    "q": "r.steps.q[r.head]",
    "k": "r.steps.k[r.steps.kv_head_of[r.head]]",
    "v": "r.steps.v[r.steps.kv_head_of[r.head]]",
    "q_plain": "None if r.steps.q_plain is None else r.steps.q_plain[r.head]",
    "k_plain": "None if r.steps.k_plain is None else r.steps.k_plain[r.steps.kv_head_of[r.head]]",
    "scores_plain": "None if r.steps.scores_plain is None else r.steps.scores_plain[r.head]",
    "scale": "r.steps.scale",
    "allowed": "r.steps.allowed",
    "scores_unscaled": "r.steps.scores[r.head]",
    "scores": "r.steps.masked[r.head]",
    "layer_allowed": "r.masks",
    "query_hidden_states": "torch.stack([h[r.query.index] for h in r.sections['model'].hidden_states])",
    "first_token_share": "1.0 if len(r.tokens) < 2 else float(r.steps.weights[r.head][1:, 0].mean())",
    "is_special": "lambda index: r.tokens[index] in r.sections['model'].special_tokens",
}
_VARIANT = {
    **{name: f"r.sections['positional'].{name}" for name in (
        "encoding", "rope_angles", "alibi_slopes", "alibi_bias", "distance_check", "distance_check_key")},
    **{name: f"r.steps.{name}" for name in ("q", "k", "v", "scale", "row_max", "exp", "exp_sum", "weights", "output")},
    **{name: f"getattr(r.section('projections'), '{name}', None)" for name in ("w_q", "w_k", "w_v")},
    **{name: f"getattr(r.section('multihead'), '{name}', None)" for name in ("concat", "w_o")},
    "variant": "r.sections['inputs'].variant",
    "source": "r.sections['inputs'].source",
    "seed": "r.sections['inputs'].seed",
    "positional": "r.sections['positional'].name",
    "inputs": "r.steps.input",
    "n_kv_heads": "int(r.steps.k.shape[0])",
    "d_k": "int(r.steps.q.shape[-1])",
    "q_unrotated": "r.steps.q if r.steps.q_plain is None else r.steps.q_plain",
    "k_unrotated": "r.steps.k if r.steps.k_plain is None else r.steps.k_plain",
    "mask": "r.steps.allowed",
    "scores_unscaled": "r.steps.scores",
    "scores": "r.steps.scaled",
    "masked_scores": "r.steps.masked",
    "weights_unscaled": "r.sections['scaling'].weights_unscaled",
    "head_outputs": "r.steps.context",
    "query_index": "r.query.index",
    "query_token": "r.query.token",
    "flash": "r.section('flash')",
    "projected": "r.section('projections') is not None",
    "scaled": "r.sections['inputs'].variant not in UNSCALED",
    "kv_head_of": "list(r.steps.kv_head_of)",
}
_SEED = {
    **{name: f"r.steps.{name}[0]" for name in ("scores", "row_max", "exp", "exp_sum", "weights", "context")},
    "source": "r.sections['inputs'].source",
    "row_sums": "r.steps.weights[0].sum(dim=-1)",
    "dim": "int(r.embeddings.shape[1])",
}
OLD_NAMES = {
    "ModelTrace": {**_MODEL, "record": "r"},
    "VariantTrace": {**_VARIANT, "record": "r"},
    "Trace": {**_SEED, "record": "r"},
}
"""Each old view's names the record lacks -> how to read them from the record ``r``."""
_COMPILED = {view: {name: compile(spelling, f"<{view}.{name}>", "eval") for name, spelling in names.items()}
             for view, names in OLD_NAMES.items()}


def view_of(record: Any) -> str:
    """The old view that ``record``'s function used to return: by the sections it holds.

    Args:
        record: an ``AttentionTrace``.

    Returns:
        "ModelTrace", "Trace" (the seed's) or "VariantTrace".
    """
    sections = record.sections
    return "ModelTrace" if "model" in sections else "Trace" if "seed" in sections else "VariantTrace"


def read_old_name(record: Any, name: str) -> Any:
    """The value an old view gave for ``name``, with a DeprecationWarning saying how to read it now.

    Args:
        record: an ``AttentionTrace``.
        name: an attribute it does not have.

    Returns:
        What the view's ``name`` returned.

    Raises:
        AttributeError: the view had no such name either.
    """
    view = view_of(record)
    code = _COMPILED[view].get(name)
    if code is None:
        raise AttributeError(f"'AttentionTrace' object has no attribute {name!r}")
    spelling = re.sub(r"\br\b", "trace", OLD_NAMES[view][name])
    warnings.warn(f"{view}.{name} is an old name: trace_* functions return the record now; read {spelling}",
                  DeprecationWarning, stacklevel=3)
    # Our own table's spelling, the one the warning shows: what it says is what runs.
    return eval(code, {"torch": torch, "UNSCALED": UNSCALED, "r": record})
