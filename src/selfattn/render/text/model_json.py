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

import torch

from selfattn.trace.record import AttentionTrace

TOP_TOKENS = 3  # as many as the text walkthrough names


def model_json(record: AttentionTrace) -> dict[str, Any]:
    """A model's whole layout: the model and its tokens, the chosen layer and head's every step, where its query looks."""
    s, h = record.steps, record.head
    kv = s.kv_head_of[h]
    m = record.sections["model"]
    info = m.infos[record.layer]
    q, n = record.query.index, len(record.tokens)
    seen = range(n) if s.allowed is None else [j for j in range(n) if bool(s.allowed[q, j])]
    weights = s.weights[h]  # (n, n)
    order = sorted(seen, key=lambda j: -float(weights[q, j]))
    return (
        {
            "variant": "model",
            "model": m.model_name,
            "family": info.family,
            "sentence": m.sentence,
            "tokens": record.tokens,
            "readable": list(m.readable),  # each token decoded alone: ' cat' for 'Ġcat'
            "special": [record.tokens[i] in m.special_tokens for i in range(n)],
            "input_ids": m.input_ids,
            "layer": record.layer,
            "head": h,
            "n_layers": record.n_layers,
            "n_heads": record.n_heads,
            "d_model": int(record.embeddings.shape[-1]),
            "head_dim": int(s.q.shape[-1]),
            "attention": {**asdict(info), "group_size": info.group_size, "kv_head": kv},
            "query": {"index": q, "token": record.query.token},
            "embeddings": record.embeddings,  # (n, d_model): X0, the first layer's input
            "embedding": {
                "formula": m.embedding.formula,
                "normalised": m.embedding.normalised,
                "note": m.embedding.note,
                "parts": {part.name: part.vectors for part in m.embedding.parts},  # name -> (n, d_model)
            },
            "layer_input": m.hidden_states[record.layer],  # (n, d_model): the hidden state entering this layer
            "attention_input": s.input,  # (n, d_model): what the attention reads (Norm(x) pre-norm)
            "q": s.q[h],  # (n, d_head), after RoPE with RoPE
            "k": s.k[kv],  # of key/value head kv_head
            "v": s.v[kv],
            "q_before_rope": None if s.q_plain is None else s.q_plain[h],  # (n, d_head) or None
            "k_before_rope": None if s.k_plain is None else s.k_plain[kv],
            "scale": s.scale,
            "allowed": None if s.allowed is None else s.allowed.tolist(),  # (n, n) bool, True = may see
            "scores_unscaled": s.scores[h],  # (n, n)
            "scores": s.masked[h],  # scale * q . k, -inf where hidden: the softmax input
            "row_max": s.row_max[h],  # (n,)
            "exp": s.exp[h],  # (n, n)
            "exp_sum": s.exp_sum[h],  # (n,)
            "weights": weights,  # (n, n)
            "context": s.context[h],  # (n, d_head)
            "first_token_share": 1.0 if n < 2 else float(weights[1:, 0].mean()),
            # (n_layers + 1, d_model): the query's vector after the embeddings, then after each layer
            "query_hidden_states": torch.stack([x[q] for x in m.hidden_states]),
            "top": [{"index": j, "token": record.tokens[j], "readable": m.readable[j], "weight": float(weights[q, j])}
                    for j in order[:TOP_TOKENS]],
        }
    )
