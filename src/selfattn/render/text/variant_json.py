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
from selfattn.trace.variant_names import UNSCALED


def positional_json(record: AttentionTrace) -> dict[str, Any]:
    """``positional``: the encoding's name and what it made."""
    pos, steps = record.sections["positional"], record.layers[0]
    info: dict[str, Any] = {"name": pos.name}
    if pos.encoding is not None:
        info["encoding"] = pos.encoding
        info["untrained"] = pos.name == "learned"
        info["input"] = steps.input
    if pos.rope_angles is not None:
        info["angles"] = pos.rope_angles
        info["q_unrotated"] = steps.q_plain
        info["k_unrotated"] = steps.k_plain
    if pos.distance_check is not None:
        # q of the query (head 0) and k of token distance_check_key (key head 0), unrotated, moved to (i, j)
        info["distance_check"] = [{"i": r.i, "j": r.j, "distance": r.distance, "score": r.score} for r in pos.distance_check]
        info["distance_check_key"] = pos.distance_check_key
    if pos.alibi_slopes is not None:
        info["slopes"] = pos.alibi_slopes
        info["bias"] = pos.alibi_bias
    return {"positional": info}


def projections_json(record: AttentionTrace) -> dict[str, Any]:
    """``projections``: the seeded, untrained W_q, W_k, W_v and the q, k, v they made."""
    w, steps = record.sections["projections"], record.layers[0]
    return {"projections": {"untrained": True, "seed": record.sections["inputs"].seed, "d_k": _d_k(record),
                            "w_q": w.w_q, "w_k": w.w_k, "w_v": w.w_v, "q": steps.q, "k": steps.k, "v": steps.v}}


def scaling_json(record: AttentionTrace) -> dict[str, Any]:
    """``scaling``: the scores and weights with and without 1 / sqrt(d_k) (for the variants that scale)."""
    if record.sections["inputs"].variant in UNSCALED:
        return {}
    steps, unscaled, per_head = record.layers[0], record.sections["scaling"].weights_unscaled, _per_head(record)
    qi, d_k = record.query.index, _d_k(record)
    return {"scaling": {
        "d_k": d_k,
        "sqrt_d_k": d_k**0.5,
        "scale": steps.scale,
        "scores_unscaled": per_head(steps.scores),
        "scores_scaled": per_head(steps.scaled),
        "weights_unscaled": per_head(unscaled),
        "weights_scaled": per_head(steps.weights),
        "query_max_weight_unscaled": per_head(unscaled[:, qi].amax(-1)),
        "query_max_weight_scaled": per_head(steps.weights[:, qi].amax(-1)),
    }}


def mask_json(record: AttentionTrace) -> dict[str, Any]:
    """``mask``: the causal rule, its alignment, which keys each query may see and the masked scores."""
    mask, steps = record.sections["mask"], record.layers[0]
    return {"mask": {"kind": mask.kind, "align": mask.align, "allowed": steps.allowed,
                     "masked_scores": _per_head(record)(steps.masked)}}


def multihead_json(record: AttentionTrace) -> dict[str, Any]:
    """``heads`` (each head's q, k, v, scores, weights, output) and ``multihead`` (the concat and W_o)."""
    steps, multihead = record.layers[0], record.sections["multihead"]
    heads = [
        {"head": h, "kv_head": g, "q": steps.q[h], "k": steps.k[g], "v": steps.v[g], "scores": steps.masked[h],
         "weights": steps.weights[h], "output": steps.context[h]}
        for h, g in enumerate(steps.kv_head_of)
    ]
    n_heads, n_kv_heads = steps.n_heads, int(steps.k.shape[0])
    return {"heads": heads, "multihead": {
        "n_heads": n_heads,
        "n_kv_heads": n_kv_heads,
        "group_size": n_heads // n_kv_heads,
        "kv_head_of": list(steps.kv_head_of),
        "concat": multihead.concat,
        "w_o": multihead.w_o,
        "output": steps.output,
    }}


def flash_json(record: AttentionTrace) -> dict[str, Any]:
    """``flash``: the online softmax of the query's row, block by block, and the result against the plain softmax."""
    f, qi = record.sections["flash"], record.query.index
    blocks = [
        {
            "start": b.start,
            "end": b.end,
            "tokens": record.tokens[b.start : b.end],
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
    return {"flash": {
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
    }}


def variant_rows_json(record: AttentionTrace) -> dict[str, Any]:
    """The query's row in every step, then the whole matrices, as the seed's keys name them."""
    steps, per_head, qi = record.layers[0], _per_head(record), record.query.index
    unscaled = record.sections["scaling"].weights_unscaled
    return {
        "query": {
            "index": qi,
            "math_index": qi + 1,
            "token": record.query.token,
            "scores_unscaled": per_head(steps.scores[:, qi]),
            "scores": per_head(steps.masked[:, qi]),
            "max": per_head(steps.row_max[:, qi]),
            "exp": per_head(steps.exp[:, qi]),
            "exp_sum": per_head(steps.exp_sum[:, qi]),
            "weights": per_head(steps.weights[:, qi]),
            "weights_unscaled": per_head(unscaled[:, qi]),
            "head_context": per_head(steps.context[:, qi]),
            "context": steps.output[qi],
        },
        "scores": per_head(steps.masked),
        "weights": per_head(steps.weights),
        "row_sums": per_head(steps.weights.sum(-1)),
        "context": steps.output,
    }


def _per_head(record: AttentionTrace):
    """Keep the heads axis (multihead, gqa) or drop it (the single-head variants), as the variant shows its steps."""
    return (lambda x: x) if record.sections["variant"].keeps_heads_axis else (lambda x: x[0])


def _d_k(record: AttentionTrace) -> int:
    """The width of each head's queries and keys."""
    return int(record.layers[0].q.shape[-1])
