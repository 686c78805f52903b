"""Training self-attention in one step: Q, K and V made head by head, attended, the heads concatenated.

    [Q_h; K_h; V_h] = X W_h^T + b_h      for each of the 3H row blocks W_h (d_head, d) of the
                                         stacked W = [c W_q; W_k; W_v], c = 1 / sqrt(d_head)
    head_h = softmax(Q_h K_h^T + mask) V_h,   Y = concat(head_0 .. head_(H-1))   (batch, seq, H d_head)
    backward   the heads' gradients from ``attend_folded_backward``; then, with
               dP = [dQ, dK, dV] (batch * seq, 3 H d_head):  dX = dP W,  dW = dP^T X,  db = sum of dP's rows

Why a step of its own: ``x @ W^T`` lays its result out (batch, seq, heads, d_head), so
the heads of a plain projection are strided views, and the batched products of attention
copy each of Q, K and V first, and their gradients back. Here the projection runs per
head instead, ``torch.baddbmm`` over the 3H weight blocks with X shared by all (an
expanded view: nothing copied), so every head's (seq, d_head) block comes out
contiguous, stored (3H, batch, seq, d_head), and folds for ``attend_folded`` as it is.
The backward writes dQ, dK, dV into one buffer of that layout and copies it once into
(batch, seq, 3, heads, d_head) for the two products. Folding c into W_q (a (H d_head,
d) matrix) spares a pass over every score matrix and its gradient. And one autograd
function instead of two: on a small model a Python function's fixed cost shows.

Measured (a training step of nanoGPT's CPU recipe, 2 threads; bench/train.py): see
docs/training-bench.md.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from selfattn.attention.softmax_attention import causal_bias, attend_folded, attend_folded_backward


def packed_self_attention(x: torch.Tensor, weights, biases, n_heads: int, is_causal: bool) -> torch.Tensor:
    """concat_h softmax(Q_h K_h^T / sqrt(d_head) + mask) V_h.   (batch, seq, d) -> (batch, seq, H d_head)

    Args:
        x: X, (batch, seq, d), seq >= 1.
        weights: (W_q, W_k, W_v), each (H d_head, d).
        biases: (b_q, b_k, b_v), each (H d_head,), or None.
        n_heads: H, the heads of each of Q, K and V.
        is_causal: query i sees keys j <= i.

    Returns:
        The heads side by side, (batch, seq, H d_head): what W_o takes.
    """
    return _PackedSelfAttention.apply(x, n_heads, is_causal, *weights, *(biases or (None, None, None)))


class _PackedSelfAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n_heads, is_causal, w_q, w_k, w_v, b_q, b_k, b_v):
        batch, seq, width = x.shape
        blocks, d_head = 3 * n_heads, w_q.shape[0] // n_heads
        scale = d_head ** -0.5
        weight = torch.cat([w_q * scale, w_k, w_v])  # (3 H d_head, d)
        rows = x.reshape(batch * seq, width)  # (batch * seq, d)
        per_head = weight.view(blocks, d_head, width).transpose(1, 2)  # (3H, d, d_head)
        shared = rows.expand(blocks, *rows.shape)  # (3H, batch * seq, d): the same X for every block
        if b_q is None:
            qkv = torch.bmm(shared, per_head)  # (3H, batch * seq, d) @ (3H, d, d_head) -> (3H, batch * seq, d_head)
        else:
            bias = torch.cat([b_q * scale, b_k, b_v])  # (3 H d_head,)
            qkv = torch.baddbmm(bias.view(blocks, 1, d_head), shared, per_head)
        q, k, v = qkv.view(3, n_heads * batch, seq, d_head)  # each (H * batch, seq, d_head), contiguous
        mask = causal_bias(seq, seq, x.dtype, x.device) if is_causal else None
        out, probs = attend_folded(q, k, v, 1.0, mask)  # (H * batch, seq, d_head)
        ctx.save_for_backward(rows, weight, q, k, v, probs, out)
        ctx.sizes, ctx.scale, ctx.has_bias = (batch, seq, n_heads, d_head), scale, b_q is not None
        heads = out.view(n_heads, batch, seq, d_head).permute(1, 2, 0, 3)  # (batch, seq, H, d_head), a view
        return heads.reshape(batch, seq, n_heads * d_head)  # the concat: one copy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_concat):
        rows, weight, q, k, v, probs, out = ctx.saved_tensors
        batch, seq, n_heads, d_head = ctx.sizes
        grad_out = grad_concat.view(batch, seq, n_heads, d_head).permute(2, 0, 1, 3)  # (H, batch, seq, d_head)
        grad_out = grad_out.reshape(n_heads * batch, seq, d_head)  # folded like out: one copy
        grads = rows.new_empty(3, n_heads, batch, seq, d_head)  # dQ, dK, dV in the layout of the forward's qkv
        attend_folded_backward(q, k, v, probs, out, grad_out, 1.0, into=grads.view(3, n_heads * batch, seq, d_head))
        flat = grads.permute(2, 3, 0, 1, 4).reshape(batch * seq, 3 * n_heads * d_head)  # dP, in the layout of X W^T: one copy
        grad_x = (flat @ weight).view(batch, seq, -1)  # (batch * seq, 3 H d_head) @ (3 H d_head, d)
        grad_w = (flat.T @ rows).chunk(3)  # (3 H d_head, batch * seq) @ (batch * seq, d), split
        grad_w[0].mul_(ctx.scale)  # through c W_q
        grad_b = (None, None, None)
        if ctx.has_bias:
            grad_b = flat.sum(dim=0).chunk(3)
            grad_b[0].mul_(ctx.scale)
        return grad_x, None, None, *grad_w, *grad_b
