"""A variant's sections as JSON: one key (or two) per idea the variant adds to the seed.

``json_out`` calls these in the record's section order: positional, projections,
scaling, mask, heads and multihead, flash, then the rows of every step. Single-head
variants (simple, scaled, qkv, causal) drop the heads axis from ``scores``, ``weights``
and ``query``, so they read like the seed's output; multihead and gqa keep it first:
(heads, n, n) (the "variant" section says which).
"""

from __future__ import annotations

from typing import Any

from selfattn.trace.record import AttentionTrace
from selfattn.trace.variants import VariantTrace


def positional_json(record: AttentionTrace) -> dict[str, Any]:
    """``positional``: the encoding's name and what it made."""
    return {"positional": _positional(VariantTrace(record))}


def projections_json(record: AttentionTrace) -> dict[str, Any]:
    """``projections``: the seeded, untrained W_q, W_k, W_v and the q, k, v they made."""
    t = VariantTrace(record)
    return {"projections": {"untrained": True, "seed": t.seed, "d_k": t.d_k, "w_q": t.w_q, "w_k": t.w_k, "w_v": t.w_v,
                            "q": t.q, "k": t.k, "v": t.v}}


def scaling_json(record: AttentionTrace) -> dict[str, Any]:
    """``scaling``: the scores and weights with and without 1 / sqrt(d_k) (for the variants that scale)."""
    t, per_head = VariantTrace(record), _per_head(record)
    if not t.scaled:
        return {}
    qi = t.query_index
    return {"scaling": {
        "d_k": t.d_k,
        "sqrt_d_k": t.d_k**0.5,
        "scale": t.scale,
        "scores_unscaled": per_head(t.scores_unscaled),
        "scores_scaled": per_head(t.scores),
        "weights_unscaled": per_head(t.weights_unscaled),
        "weights_scaled": per_head(t.weights),
        "query_max_weight_unscaled": per_head(t.weights_unscaled[:, qi].amax(-1)),
        "query_max_weight_scaled": per_head(t.weights[:, qi].amax(-1)),
    }}


def mask_json(record: AttentionTrace) -> dict[str, Any]:
    """``mask``: the causal rule, its alignment, which keys each query may see and the masked scores."""
    mask, steps = record.sections["mask"], record.layers[0]
    return {"mask": {"kind": mask.kind, "align": mask.align, "allowed": steps.allowed,
                     "masked_scores": _per_head(record)(steps.masked)}}


def multihead_json(record: AttentionTrace) -> dict[str, Any]:
    """``heads`` (each head's q, k, v, scores, weights, output) and ``multihead`` (the concat and W_o)."""
    t = VariantTrace(record)
    heads = [
        {"head": h, "kv_head": g, "q": t.q[h], "k": t.k[g], "v": t.v[g], "scores": t.masked_scores[h],
         "weights": t.weights[h], "output": t.head_outputs[h]}
        for h, g in enumerate(t.kv_head_of)
    ]
    return {"heads": heads, "multihead": {
        "n_heads": t.n_heads,
        "n_kv_heads": t.n_kv_heads,
        "group_size": t.n_heads // t.n_kv_heads,
        "kv_head_of": t.kv_head_of,
        "concat": t.concat,
        "w_o": t.w_o,
        "output": t.output,
    }}


def flash_json(record: AttentionTrace) -> dict[str, Any]:
    """``flash``: the online softmax of the query's row, block by block."""
    return {"flash": _flash(VariantTrace(record))}


def variant_rows_json(record: AttentionTrace) -> dict[str, Any]:
    """The query's row in every step, then the whole matrices, as the seed's keys name them."""
    t, per_head = VariantTrace(record), _per_head(record)
    qi = t.query_index
    return {
        "query": {
            "index": qi,
            "math_index": qi + 1,
            "token": t.query_token,
            "scores_unscaled": per_head(t.scores_unscaled[:, qi]),
            "scores": per_head(t.masked_scores[:, qi]),
            "max": per_head(t.row_max[:, qi]),
            "exp": per_head(t.exp[:, qi]),
            "exp_sum": per_head(t.exp_sum[:, qi]),
            "weights": per_head(t.weights[:, qi]),
            "weights_unscaled": per_head(t.weights_unscaled[:, qi]),
            "head_context": per_head(t.head_outputs[:, qi]),
            "context": t.output[qi],
        },
        "scores": per_head(t.masked_scores),
        "weights": per_head(t.weights),
        "row_sums": per_head(t.weights.sum(-1)),
        "context": t.output,
    }


def _per_head(record: AttentionTrace):
    """Keep the heads axis (multihead, gqa) or drop it (the single-head variants), as the variant shows its steps."""
    return (lambda x: x) if record.sections["variant"].keeps_heads_axis else (lambda x: x[0])


def _flash(t: VariantTrace) -> dict[str, Any]:
    """The online softmax of the query's row, block by block, and the whole result against the plain softmax."""
    f, qi = t.flash, t.query_index
    blocks = [
        {
            "start": b.start,
            "end": b.end,
            "tokens": t.tokens[b.start : b.end],
            "scores": b.scores[qi],
            "block_max": b.block_max[qi],
            "m_before": b.m_before[qi],
            "m_after": b.m_after[qi],
            "rescale": b.rescale[qi],
            "exp": b.exp[qi],
            "exp_sum": b.exp_sum[qi],
            "l_before": b.l_before[qi],
            "l_after": b.l_after[qi],
            "acc_before": b.acc_before[qi],
            "acc_after": b.acc_after[qi],
        }
        for b in f.blocks
    ]
    return {
        "block_size": f.block_size,
        "scale": f.scale,
        "query_index": qi,
        "blocks": blocks,
        "online_output": f.online_output,
        "online_lse": f.online_lse,
        "output": f.output,
        "plain_output": f.plain_output,
        "max_difference": f.max_difference,
        "lse": f.lse,
        "weights_from_lse": f.weights_from_lse,
        "weights_max_difference": f.weights_max_difference,
    }


def _positional(t: VariantTrace) -> dict[str, Any]:
    info: dict[str, Any] = {"name": t.positional}
    if t.encoding is not None:
        info["encoding"] = t.encoding
        info["untrained"] = t.positional == "learned"
        info["input"] = t.inputs
    if t.rope_angles is not None:
        info["angles"] = t.rope_angles
        info["q_unrotated"] = t.q_unrotated
        info["k_unrotated"] = t.k_unrotated
    if t.distance_check is not None:
        # q of the query (head 0) and k of token distance_check_key (key head 0), unrotated, moved to (i, j)
        info["distance_check"] = [
            {"i": r.i, "j": r.j, "distance": r.distance, "score": r.score} for r in t.distance_check
        ]
        info["distance_check_key"] = t.distance_check_key
    if t.alibi_slopes is not None:
        info["slopes"] = t.alibi_slopes
        info["bias"] = t.alibi_bias
    return info

