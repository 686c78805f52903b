"""What transformers' own modules hold, read out for the circuit tests (attribution, path patching).

    parts = hf_parts(hf, ids)      # one forward of a transformers decoder, with hooks
    parts.z[l]                     # (seq, H, d_head): the o_proj input of layer l, by head
    parts.attn_out[l]              # (seq, d): o_proj's output, before any post-attention norm
    parts.final_in                 # (seq, d): what the final norm read
    head_share(hf, parts, l, h, position, target)   # head (l, h)'s share of the target's logit

Shares follow the paper formula with each norm's scale read from transformers' module at
the run's vector: RMSNorm g / sqrt(mean(x^2) + eps) (Gemma's g = 1 + w), LayerNorm
(x - mean) g / std(x). Nothing of selfattn is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def layers_of(hf):
    return hf.transformer.h if hf.config.model_type == "gpt2" else hf.model.layers


def output_projection(hf, layer: int):
    block = layers_of(hf)[layer]
    return block.attn.c_proj if hf.config.model_type == "gpt2" else block.self_attn.o_proj


def final_norm(hf):
    return hf.transformer.ln_f if hf.config.model_type == "gpt2" else hf.model.norm


def post_attention_norm(hf, layer: int):
    """Gemma's norm of the attention output before it is added (None elsewhere)."""
    if hf.config.model_type.startswith("gemma"):
        return layers_of(hf)[layer].post_attention_layernorm
    return None


def unembedding(hf) -> torch.Tensor:
    return hf.get_output_embeddings().weight  # (vocab, d)


def head_dim(hf) -> int:
    c = hf.config
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


@dataclass
class Parts:
    z: list = field(default_factory=list)  # per layer (seq, H, d_head)
    attn_out: list = field(default_factory=list)  # per layer (seq, d)
    final_in: torch.Tensor | None = None  # (seq, d)
    logits: torch.Tensor | None = None  # (seq, vocab)


def hf_parts(hf, ids: torch.Tensor) -> Parts:
    """One forward of ``hf`` on ids (1, seq) with what the circuit tests read (float64)."""
    parts, handles = Parts(), []
    layers = len(layers_of(hf))
    parts.z, parts.attn_out = [None] * layers, [None] * layers

    def keep(l):
        def hook(module, args, output):
            parts.z[l] = args[0][0].double().view(args[0].shape[1], -1, head_dim(hf))
            parts.attn_out[l] = output[0].double()
        return hook

    for l in range(layers):
        handles.append(output_projection(hf, l).register_forward_hook(keep(l)))
    handles.append(final_norm(hf).register_forward_hook(
        lambda m, args, out: setattr(parts, "final_in", args[0][0].double())))
    try:
        with torch.no_grad():
            parts.logits = hf(ids).logits[0].double()
    finally:
        for handle in handles:
            handle.remove()
    return parts


def norm_scale(norm, x: torch.Tensor):
    """(f, bias): the norm made linear at x, f(c) its share of a part c; read from the module's own parameters."""
    if isinstance(norm, torch.nn.LayerNorm):
        scale = norm.weight.double() / torch.sqrt(x.var(unbiased=False) + norm.eps)
        return (lambda c: (c - c.mean(dim=-1, keepdim=True)) * scale), norm.bias.double()
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps")
    gain = norm.weight.double() + (1.0 if type(norm).__name__.startswith("Gemma") else 0.0)
    scale = gain / torch.sqrt(x.pow(2).mean() + eps)
    return (lambda c: c * scale), None


def head_share(hf, parts: Parts, layer: int, head: int, position: int, target: int) -> float:
    """Head (layer, head)'s share of the target's logit at position, from transformers' modules."""
    d = head_dim(hf)
    proj = output_projection(hf, layer)
    w_o = proj.weight.double() if hf.config.model_type != "gpt2" else proj.weight.double().T  # (d_model, H d_head)
    part = parts.z[layer][position, head] @ w_o[:, head * d:(head + 1) * d].T  # (d_model,)
    post = post_attention_norm(hf, layer)
    if post is not None:
        f, _ = norm_scale(post, parts.attn_out[layer][position])
        part = f(part)
    f, _ = norm_scale(final_norm(hf), parts.final_in[position])
    return float((f(part) @ unembedding(hf)[target].double()).detach())
