"""A ModelTrace as JSON: one head of a pretrained model, every number at full precision.

Matrices are for the chosen layer and head only: embeddings and layer_input (n, d_model),
q, k, v and context (n, head_dim), the score and weight matrices (n, n) with every token
as the query; row_max and exp_sum are (n,). ``top`` lists where the query looks most.
``query_hidden_states`` (n_layers + 1, d_model) is the query's vector after the
embeddings and after each layer, from the same run.
"""

from __future__ import annotations

from typing import Any

from selfattn.explain.json_out import plain
from selfattn.models.model_trace import ModelTrace

TOP_TOKENS = 3  # as many as the text walkthrough names


def model_to_dict(t: ModelTrace) -> dict[str, Any]:
    q = t.query_index
    order = sorted(range(len(t.tokens)), key=lambda j: -float(t.weights[q, j]))
    return plain(
        {
            "variant": "model",
            "model": t.model_name,
            "sentence": t.sentence,
            "tokens": t.tokens,
            "input_ids": t.input_ids,
            "layer": t.layer,
            "head": t.head,
            "n_layers": t.n_layers,
            "n_heads": t.n_heads,
            "d_model": t.d_model,
            "head_dim": t.head_dim,
            "query": {"index": q, "token": t.query_token},
            "embeddings": t.embeddings,  # (n, d_model): the encoder's input, after LayerNorm
            "layer_input": t.layer_input,  # (n, d_model): the hidden state entering this layer
            "q": t.q,  # (n, head_dim)
            "k": t.k,
            "v": t.v,
            "scale": t.scale,
            "scores_unscaled": t.scores_unscaled,  # (n, n)
            "scores": t.scores,
            "row_max": t.row_max,  # (n,)
            "exp": t.exp,  # (n, n)
            "exp_sum": t.exp_sum,  # (n,)
            "weights": t.weights,  # (n, n)
            "context": t.context,  # (n, head_dim)
            "query_hidden_states": t.query_hidden_states,  # (n_layers + 1, d_model): embeddings, then each layer
            "top": [{"index": j, "token": t.tokens[j], "weight": float(t.weights[q, j])} for j in order[:TOP_TOKENS]],
        }
    )
