"""The residual stream as a sum of parts, and a norm made linear so that each part keeps its share.

A pre-norm decoder adds every part's output to one stream: x_L = e + sum_l (a_l + m_l),
a_l = sum_h z_h W_o,h + b_o. A norm between a part and what reads it (the final norm before
the unembedding, Gemma's post-attention norm) is not linear, but with its scale held at
the value it had in the run it is: Norm'(c) = c * g / rms(x) (RMSNorm), or
(c - mean(c)) * g / std(x) + b (LayerNorm). ``attribute`` reads each part's share of a logit
through it; path patching moves one head's part from one run to another.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from selfattn.attention.norm_and_mlp import RMSNorm
from selfattn.errors import ModelError


class FrozenNorm(NamedTuple):
    """A norm made linear at the vectors it read in a run: Norm'(c) = centre(c) * scale (+ bias once)."""

    scale: torch.Tensor  # (..., d): g / rms(x), or g / std(x) for a LayerNorm, each vector's own
    centred: bool  # a LayerNorm takes each part's mean off first
    bias: torch.Tensor | None  # a LayerNorm's b: a part of its own

    def share(self, part: torch.Tensor, heads: bool = False) -> torch.Tensor:
        """Norm'(part): (..., d), or (..., H, d) with ``heads`` (one scale for every head at a position)."""
        if self.centred:
            part = part - part.mean(dim=-1, keepdim=True)
        return part * (self.scale.unsqueeze(-2) if heads else self.scale)


def frozen_norm(norm: nn.Module, x: torch.Tensor) -> FrozenNorm:
    """RMSNorm or LayerNorm with its scale frozen at the vectors x (..., d) it read (float64)."""
    x = x.double()
    if isinstance(norm, RMSNorm):
        gain = norm.weight.double() + (1.0 if norm.gain == "1+w" else 0.0)
        return FrozenNorm(gain / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + norm.eps), False, None)
    if isinstance(norm, nn.LayerNorm):
        gain = torch.ones(x.shape[-1], dtype=x.dtype) if norm.weight is None else norm.weight.double()
        scale = gain / torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)
        return FrozenNorm(scale, True, None if norm.bias is None else norm.bias.double())
    raise ModelError(f"a share through a norm needs RMSNorm or LayerNorm, not {type(norm).__name__}")


def attention_parts(block, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What the block's attention adds to the stream, part by part.   z (..., H, d_head) -> (..., H, d_model), (..., d_model) or None

    Each head's part z_h W_o,h, and W_o's bias (None without one; it is no head's). Where
    the block normalises attention again before adding it (Gemma's post-attention norm),
    both pass through that norm with its scale frozen at the layer's whole output at each
    position, so that they still add up to what the block added. float64.
    """
    attention, c = block.attention, block.attention.config
    w_o = attention.w_o.weight.double().view(c.d_model, c.n_heads, c.d_head)  # (d_model, H, d_head)
    parts = torch.einsum("...he,dhe->...hd", z.double(), w_o)  # (..., H, d_model)
    bias = None if attention.w_o.bias is None else attention.w_o.bias.double()
    if block.post_attention_norm is not None:
        post = frozen_norm(block.post_attention_norm, parts.sum(dim=-2) + (0 if bias is None else bias))
        parts, bias = post.share(parts, heads=True), None if bias is None else post.share(bias)
    return parts, bias


def head_parts(block, z: torch.Tensor) -> torch.Tensor:
    """Each head's part of what the block's attention adds to the stream (``attention_parts`` without the bias)."""
    return attention_parts(block, z)[0]
