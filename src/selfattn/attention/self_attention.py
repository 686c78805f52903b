"""``SelfAttention``: one head with learned projections, the seed's next step.

    Z = softmax(X W_q (X W_k)^T / sqrt(d_k)) X W_v

The module owns W_q, W_k and W_v; the attention is ``attention_forward`` (and, for
tracing, ``attention_steps``), the same step functions every path uses.
"""

from __future__ import annotations

import torch
from torch import nn

from selfattn.attention.config import AttentionConfig
from selfattn.attention.functional import AttentionSteps, attention_forward, attention_steps
from selfattn.checks import check_width


class SelfAttention(nn.Module):
    """One head with learned projections: Z = softmax(X W_q (X W_k)^T / sqrt(d_k)) X W_v.

    (..., seq, d_in) -> (..., seq, d_v). The seed's next step: the same three lines, but
    queries, keys and values are three different linear views of the embeddings.

    Args:
        d_in: width of the input embeddings X.
        d_k: width of the queries and keys (the columns of W_q and W_k).
        d_v: width of the values and of the output; None means d_k.
        bias: whether the three projections have biases (default False, as in the seed).

    Raises:
        ConfigError: a width is not a positive integer, or bias is not a bool.
    """

    def __init__(self, d_in: int, d_k: int, d_v: int | None = None, bias: bool = False) -> None:
        """Create the projections W_q, W_k, W_v; the class docstring describes the arguments."""
        super().__init__()
        AttentionConfig(d_model=d_in, d_head=d_k, bias=bias)  # validates the sizes
        d_v = d_k if d_v is None else d_v
        AttentionConfig(d_model=d_in, d_head=d_v)
        self.w_q = nn.Linear(d_in, d_k, bias=bias)
        self.w_k = nn.Linear(d_in, d_k, bias=bias)
        self.w_v = nn.Linear(d_in, d_v, bias=bias)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False, need_weights: bool = False
    ):
        """Z = softmax(X W_q (X W_k)^T / sqrt(d_k) + mask) X W_v.   (..., seq, d_in) -> (..., seq, d_v)

        Args:
            x: the embeddings X, (batch, seq, d_in) or (seq, d_in).
            attn_mask: None, bool (True = may attend) or float (added to the scores),
                broadcastable to (..., seq, seq).
            is_causal: token i sees only tokens j <= i.
            need_weights: also return the attention weights.

        Returns:
            Z, (..., seq, d_v); with need_weights=True the pair (Z, A), A (..., seq, seq).

        Raises:
            ShapeError: x is not (batch, seq, d_in) or (seq, d_in), or the mask does not fit.
            OptionError: attn_mask comes with is_causal=True.
        """
        check_width(x, self.w_q.in_features, "x")
        out = attention_forward(
            self.w_q(x), self.w_k(x), self.w_v(x), attn_mask=attn_mask, is_causal=is_causal, need_weights=need_weights
        )
        return (out.output, out.weights) if need_weights else out.output

    def steps(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> AttentionSteps:
        """The computation of ``forward`` with every intermediate.   (..., seq, d_in) -> AttentionSteps

        Args:
            x: the embeddings X, (batch, seq, d_in) or (seq, d_in).
            attn_mask: None, bool (True = may attend) or float, broadcastable to (..., seq, seq).
            is_causal: token i sees only tokens j <= i.

        Returns:
            ``AttentionSteps`` of ``selfattn.attention_steps`` on Q = X W_q, K = X W_k,
                V = X W_v: the scale, scores and masked scores (..., seq, seq), the softmax
                parts, the weights and Z (..., seq, d_v).

        Raises:
            ShapeError: x is not (batch, seq, d_in) or (seq, d_in), or the mask does not fit.
            OptionError: attn_mask comes with is_causal=True.
        """
        check_width(x, self.w_q.in_features, "x")
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)  # (..., seq, d_k), (..., seq, d_k), (..., seq, d_v)
        return attention_steps(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
