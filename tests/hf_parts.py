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
    hidden: tuple = ()  # the stream entering each layer, (seq, d) each (transformers' hidden_states)


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
            out = hf(ids, output_hidden_states=True)
        parts.logits = out.logits[0].double()
        parts.hidden = tuple(h[0] for h in out.hidden_states[:layers])
    finally:
        for handle in handles:
            handle.remove()
    return parts


def norm_scale(norm, x: torch.Tensor):
    """(f, bias): the norm made linear at x, f(c) its share of a part c; read from the module's own parameters."""
    if isinstance(norm, torch.nn.LayerNorm):
        scale = norm.weight.double() / torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)
        return (lambda c: (c - c.mean(dim=-1, keepdim=True)) * scale), norm.bias.double()
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps")
    gain = norm.weight.double() + (1.0 if type(norm).__name__.startswith("Gemma") else 0.0)
    scale = gain / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (lambda c: c * scale), None


def head_share(hf, parts: Parts, layer: int, head: int, position: int, target: int) -> float:
    """Head (layer, head)'s share of the target's logit at position, from transformers' modules."""
    f, _ = norm_scale(final_norm(hf), parts.final_in[position])
    return float((f(head_output(hf, parts, layer, head)[position]) @ unembedding(hf)[target].double()).detach())


def input_norm(hf, layer: int):
    block = layers_of(hf)[layer]
    return block.ln_1 if hf.config.model_type == "gpt2" else block.input_layernorm


def head_output(hf, parts: Parts, layer: int, head: int) -> torch.Tensor:
    """Head (layer, head)'s part of the stream at every position, (seq, d) float64 (Gemma: through its
    post-attention norm with the scale of that run)."""
    d = head_dim(hf)
    proj = output_projection(hf, layer)
    w_o = proj.weight.double() if hf.config.model_type != "gpt2" else proj.weight.double().T  # (d_model, H d_head)
    part = parts.z[layer][:, head] @ w_o[:, head * d:(head + 1) * d].T  # (seq, d_model)
    post = post_attention_norm(hf, layer)
    if post is not None:
        f, _ = norm_scale(post, parts.attn_out[layer])  # per position: mean over the last axis
        part = f(part)
    return part


def projections(hf, layer: int) -> dict:
    """via letter -> (module, offset of its columns in the module's output): q_proj/k_proj/v_proj, or GPT-2's c_attn."""
    block = layers_of(hf)[layer]
    if hf.config.model_type == "gpt2":
        d = hf.config.hidden_size
        return {"q": (block.attn.c_attn, 0), "k": (block.attn.c_attn, d), "v": (block.attn.c_attn, 2 * d)}
    attn = block.self_attn
    return {"q": (attn.q_proj, 0), "k": (attn.k_proj, 0), "v": (attn.v_proj, 0)}


def hf_path_patching(hf, clean_ids, corrupted_ids, target: int, senders, receivers, via) -> float:
    """Path patching written on transformers' modules: forward hooks on the receivers' projections fed with
    the projection of Norm(x_L + sum of the senders' clean - corrupted outputs)."""
    clean, corrupted = hf_parts(hf, clean_ids), hf_parts(hf, corrupted_ids)
    delta = sum(head_output(hf, clean, l, h) - head_output(hf, corrupted, l, h) for l, h in senders)
    d = head_dim(hf)
    group = hf.config.num_attention_heads // getattr(hf.config, "num_key_value_heads", hf.config.num_attention_heads)
    handles, new = [], {}
    for layer in sorted({l for l, _ in receivers}):
        moved = (corrupted.hidden[layer] + delta).to(torch.float32)[None]  # (1, seq, d)
        with torch.no_grad():
            read = input_norm(hf, layer)(moved)
        heads = [h for l, h in receivers if l == layer]
        for x in via:
            module, offset = projections(hf, layer)[x]
            with torch.no_grad():
                out = module(read)
            for head in (heads if x == "q" else sorted({h // group for h in heads})):
                span = slice(offset + head * d, offset + (head + 1) * d)
                new.setdefault(module, []).append((span, out[..., span]))

    def hook(module, args, output):
        output = output.clone()
        for span, values in new[module]:
            output[..., span] = values
        return output

    handles = [module.register_forward_hook(hook) for module in new]
    try:
        with torch.no_grad():
            patched = hf(corrupted_ids).logits[0, -1].double().log_softmax(-1)[target]
    finally:
        for handle in handles:
            handle.remove()
    lp_clean = clean.logits[-1].log_softmax(-1)[target]
    lp_corrupted = corrupted.logits[-1].log_softmax(-1)[target]
    return float((patched - lp_corrupted) / (lp_clean - lp_corrupted))
