"""flash-attn's attention written out from its documented semantics, for the tests.

flash-attn's README and docstrings: tensors (batch, seqlen, nheads, headdim); query i sits
at key position i + seqlen_k - seqlen_q; window_size (left, right) keeps keys j with
i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right (-1 unbounded),
causal is right = 0; softcap c: s = c tanh(s / c) on the scaled scores; ALiBi:
s -= slope |i + seqlen_k - seqlen_q - j|; a query that sees nothing gives zeros.
"""

from __future__ import annotations

import math

import torch


def reference(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, slopes=None, q_first=False):
    """flash-attn's attention written out on the whole score matrix (any dtype).

    q_first: multiply q by scale (scale / softcap with a softcap) before the product, as a
    fused kernel orders it, instead of scaling the product: the same math, other roundings.
    """
    batch, q_len, heads, d = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    k = k.repeat_interleave(heads // kv_heads, dim=2)
    v = v.repeat_interleave(heads // kv_heads, dim=2)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, D)
    scale = scale if scale is not None else 1 / math.sqrt(d)
    if q_first:
        scores = (qt * (scale / softcap if softcap else scale)) @ kt.transpose(-2, -1)
        scores = softcap * torch.tanh(scores) if softcap else scores
    else:
        scores = qt @ kt.transpose(-2, -1) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(q_len)[:, None] + kv_len - q_len  # each query's key position
    j = torch.arange(kv_len)[None, :]
    if slopes is not None:
        per = (slopes if slopes.dim() == 2 else slopes[None]).to(scores.dtype)[:, :, None, None]  # (B or 1, H, 1, 1)
        scores = scores - per * (i - j).abs()
    left, right = window
    if causal:
        right = 0
    keep = torch.ones(q_len, kv_len, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ vt).transpose(1, 2), probs

