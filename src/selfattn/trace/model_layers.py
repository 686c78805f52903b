"""A model's layers for its trace: every layer's whole steps, or on a long text the chosen layer's.

A short text keeps every layer's steps (``LayerSteps``: each head's n x n scores, exp and
weights), read from each block's own ``attention_steps`` beside the model's forward pass
with its weights. That costs L x H x n x n numbers several times over, which a long text
cannot afford (SmolLM2's 30 layers of 9 heads on 2,000 tokens: tens of GB). So past
``FULL_TRACE_CELLS`` the model runs its fast path (the tiled kernel: no weights kept), and
a layer at a time each block's attention is taken again through the kernel for what it
leaves: q, k, v, each head's output and the softmax's log-sum-exp (``LayerRows``), from
which any row of the weights follows exactly. Only the chosen layer keeps its whole steps.
"""

from __future__ import annotations

import torch

from selfattn.errors import ModelError
from selfattn.kernels.flash import flash_attention
from selfattn.masks import causal_mask
from selfattn.models.description import AttentionInfo
from selfattn.pipeline.steps import attention_scores
from selfattn.trace.record import LayerRows, LayerSteps

# Layers x heads x n x n up to this many cells keeps every layer's whole steps (about seven
# n x n float32 matrices per head: 1 GB at the limit). all-MiniLM-L6-v2's 512 tokens stay
# under it; SmolLM2 (30 x 9 heads) passes it at 353 tokens.
FULL_TRACE_CELLS = 1 << 25


def every_layer_in_full(model, encoded, n: int) -> tuple[tuple[torch.Tensor, ...], tuple[LayerSteps, ...]]:
    """The forward pass with its weights, and every layer's whole steps.   -> (hidden states (1, n, d) each, layers)"""
    out = model.run(encoded, output_attentions=True, output_hidden_states=True)
    # Every layer's steps from its own block: the forward pass takes a fused path that rounds
    # differently (~1e-7), and explain and compare must agree exactly.
    every = [model.blocks[l].attention_steps(out.hidden_states[l], **model.trace_options()) for l in range(len(model.blocks))]
    # The model's own forward pass must have used these weights (a layer at a time: no stacked copies).
    for steps, weights in zip(every, out.attentions, strict=True):
        torch.testing.assert_close(steps.attention.weights[0], weights[0], rtol=0, atol=1e-5)
    layers = tuple(layer_steps(model, l, s, out.hidden_states, n) for l, s in enumerate(every))
    return out.hidden_states, layers


def chosen_layer_in_full(model, encoded, n: int, chosen: int) -> tuple[tuple[torch.Tensor, ...], tuple]:
    """The fast forward pass, the chosen layer's whole steps and every other layer's rows.   -> (hidden states, layers)

    Nothing n x n of more than one layer is held at once: the kernel never makes the score
    matrix, and the chosen layer's steps are the only whole ones kept.
    """
    hidden = model.run(encoded, output_hidden_states=True).hidden_states  # n_layers + 1 of (1, n, d)
    layers, shared = [], {}
    for l in range(len(model.blocks)):
        rows = layer_rows(model, l, hidden, n, shared)
        if l == chosen:
            steps = model.blocks[l].attention_steps(hidden[l], **model.trace_options())
            # The rows of every other layer come from the path that made these steps' numbers.
            torch.testing.assert_close(steps.attention.output[0], rows.context, rtol=0, atol=1e-5)
            rows = layer_steps(model, l, steps, hidden, n)
        layers.append(rows)
    return hidden, tuple(layers)


def layer_rows(model, layer: int, hidden_states, n: int, shared: dict) -> LayerRows:
    """Layer ``layer``'s attention through the tiled kernel: q, k, v, each head's output and lse, no n x n matrix.

    The block's attention reads what ``attention_steps`` reads (its norm of the input in a
    pre-norm block) with the model's trace options. The causal rule alone stays a rule, so
    the kernel skips the hidden tiles; ``shared`` keeps one (n, n) causal mask for every
    layer that has it.
    """
    block = model.blocks[layer]
    attention, x = block.attention, hidden_states[layer]  # x: (1, n, d)
    read = block.norm1(x) if block.config.norm_first else x  # what the attention reads
    options = model.trace_options()
    causal, mask = options.get("is_causal", block.config.causal), options.get("attn_mask")
    alone = causal and attention.causal_alone(mask)  # no window, no bias, no mask of the caller's
    heads = attention.project_heads(read, None, None, mask, causal and not alone, None, options.get("positions"))
    if heads.mask is not None and heads.mask.dtype != torch.bool:  # LayerRows rebuilds its weights from allowed alone
        raise ModelError(f"layer {layer} adds a bias to its scores: a text this long cannot be traced without "
                         "keeping every layer's weights")
    context, lse = flash_attention(
        heads.q, heads.k, heads.v, attn_mask=heads.mask, is_causal=alone, scale=heads.scale,
        enable_gqa=attention.grouped, return_lse=True,
    )  # (1, H, n, d_head), (1, H, n)
    if alone:
        allowed = shared.setdefault("causal", causal_mask(n, device=x.device))  # (n, n), True = may attend
    else:
        allowed = None if heads.mask is None else allowed_keys(heads.mask, n)
    return LayerRows(
        input=read[0],
        q=heads.q[0],
        k=heads.k[0],
        v=heads.v[0],
        q_plain=None if heads.q_plain is None else heads.q_plain[0],
        k_plain=None if heads.k_plain is None else heads.k_plain[0],
        kv_head_of=tuple(model.attention_info(layer).kv_head(h) for h in range(heads.q.shape[1])),
        scale=heads.scale if heads.scale is not None else heads.q.shape[-1] ** -0.5,
        lse=lse[0],
        context=context[0],
        allowed=allowed,
        output=hidden_states[layer + 1][0],
    )


def allowed_keys(mask: torch.Tensor, n: int) -> torch.Tensor:
    """The (n, n) bool of the keys each query may see, from the mask the attention applied."""
    if mask.dtype == torch.bool:
        return mask.reshape(-1, n, n)[0].clone()
    return torch.isfinite(mask.reshape(-1, n, n)[0])


def per_head_scores(q: torch.Tensor, k: torch.Tensor, info: AttentionInfo) -> torch.Tensor:
    """q_i . k_j for every query head and the key/value head it reads.   (H, n, d_head), (K, n, d_head) -> (H, n, n)"""
    return torch.stack([attention_scores(q[h], k[info.kv_head(h)]) for h in range(q.shape[0])])  # H of (n, n)


def layer_steps(model, layer: int, steps, hidden_states, n: int) -> LayerSteps:
    """One layer's ``AttentionSteps`` (a batch of one text) as the record's ``LayerSteps``, every head."""
    a, block, info = steps.attention, model.blocks[layer], model.attention_info(layer)
    x = hidden_states[layer]  # (1, n, d): the hidden state entering the layer
    return LayerSteps(
        input=(block.norm1(x) if block.config.norm_first else x)[0],  # what the attention reads
        q=steps.q[0],
        k=steps.k[0],
        v=steps.v[0],
        q_plain=None if steps.q_plain is None else steps.q_plain[0],
        k_plain=None if steps.k_plain is None else steps.k_plain[0],
        kv_head_of=tuple(info.kv_head(h) for h in range(steps.q.shape[1])),
        scale=a.scale,
        scores=per_head_scores(steps.q[0], steps.k[0], info),  # before the scaling
        scaled=a.scores[0],
        masked=a.masked_scores[0],
        row_max=a.softmax.shift[0, :, :, 0],
        exp=a.softmax.exp[0],
        exp_sum=a.softmax.total[0, :, :, 0],
        weights=a.weights[0],
        context=a.output[0],
        allowed=None if steps.mask is None else allowed_keys(steps.mask, n),
        output=hidden_states[layer + 1][0],
        scores_plain=None if steps.q_plain is None else per_head_scores(steps.q_plain[0], steps.k_plain[0], info),
    )
