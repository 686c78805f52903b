"""A model's section as JSON: one head of a pretrained model, every number at full precision.

Matrices are for the chosen layer and head only: embeddings (X0), layer_input and
attention_input (n, d_model), q, k, v and context (n, d_head), the score and weight
matrices (n, n) with every token as the query; row_max and exp_sum are (n,). ``top``
lists where the query looks most, among the keys it may see. ``query_hidden_states``
(n_layers + 1, d_model) is the query's vector after the embeddings and after each layer,
from the same run.

Any family: ``family``, ``readable`` and ``special`` describe the tokens; ``embedding``
the summands of X0 (``parts``: name -> (n, d_model)); ``attention`` the layer's
attention (causal, positional, rope_base, rope_scaling, n_heads, n_kv_heads, window,
norm, norm_first, feed_forward, group_size, kv_head); ``allowed`` (n, n) which keys each
query may see (null: all); ``q_before_rope`` and ``k_before_rope`` (n, d_head) the
queries and keys before RoPE's turn (null without RoPE); ``first_token_share`` this
head's mean weight on token 0 over the queries after it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from selfattn.trace.model_trace import ModelTrace
from selfattn.trace.record import AttentionTrace

TOP_TOKENS = 3  # as many as the text walkthrough names


def model_json(record: AttentionTrace) -> dict[str, Any]:
    """A model's whole layout: the model and its tokens, the chosen layer and head's every step, where its query looks."""
    t = ModelTrace(record)
    q, n = t.query_index, len(t.tokens)
    seen = range(n) if t.allowed is None else [j for j in range(n) if bool(t.allowed[q, j])]
    order = sorted(seen, key=lambda j: -float(t.weights[q, j]))
    a = t.attention
    return (
        {
            "variant": "model",
            "model": t.model_name,
            "family": a.family,
            "sentence": t.sentence,
            "tokens": t.tokens,
            "readable": list(t.readable),  # each token decoded alone: ' cat' for 'Ġcat'
            "special": [t.is_special(i) for i in range(n)],
            "input_ids": t.input_ids,
            "layer": t.layer,
            "head": t.head,
            "n_layers": t.n_layers,
            "n_heads": t.n_heads,
            "d_model": t.d_model,
            "head_dim": t.d_head,
            "attention": {**asdict(a), "group_size": a.group_size, "kv_head": t.kv_head},
            "query": {"index": q, "token": t.query_token},
            "embeddings": t.embeddings,  # (n, d_model): X0, the first layer's input
            "embedding": {
                "formula": t.embedding.formula,
                "normalised": t.embedding.normalised,
                "note": t.embedding.note,
                "parts": {part.name: part.vectors for part in t.embedding.parts},  # name -> (n, d_model)
            },
            "layer_input": t.layer_input,  # (n, d_model): the hidden state entering this layer
            "attention_input": t.attention_input,  # (n, d_model): what the attention reads (Norm(x) pre-norm)
            "q": t.q,  # (n, d_head), after RoPE with RoPE
            "k": t.k,  # of key/value head kv_head
            "v": t.v,
            "q_before_rope": t.q_plain,  # (n, d_head) or None
            "k_before_rope": t.k_plain,
            "scale": t.scale,
            "allowed": None if t.allowed is None else t.allowed.tolist(),  # (n, n) bool, True = may see
            "scores_unscaled": t.scores_unscaled,  # (n, n)
            "scores": t.scores,
            "row_max": t.row_max,  # (n,)
            "exp": t.exp,  # (n, n)
            "exp_sum": t.exp_sum,  # (n,)
            "weights": t.weights,  # (n, n)
            "context": t.context,  # (n, d_head)
            "first_token_share": t.first_token_share,
            "query_hidden_states": t.query_hidden_states,  # (n_layers + 1, d_model): embeddings, then each layer
            "top": [{"index": j, "token": t.tokens[j], "readable": t.readable[j], "weight": float(t.weights[q, j])}
                    for j in order[:TOP_TOKENS]],
        }
    )
