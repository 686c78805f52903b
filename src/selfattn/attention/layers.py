"""The pieces later decoder families put around attention: RMSNorm and the gated feed-forward.

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g                 Zhang and Sennrich 2019
    SwiGLU(x)  = (silu(x W_gate) * (x W_up)) W_down,  silu(z) = z sigmoid(z)    Shazeer 2020

RMSNorm drops LayerNorm's centring and bias: it only rescales each vector to unit root
mean square and multiplies by a learned gain. The gated feed-forward multiplies two
projections of x, one through silu, before projecting back. Llama, Mistral and Qwen2 use
both; GPT-2 uses LayerNorm and GELU (tanh form) in ``FeedForward``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from selfattn.attention.config import TransformerConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * g, over the last axis.   (..., d), (d,) -> (..., d)

    Computed in float32 at least (half-precision inputs are upcast for the mean of
    squares, then cast back), as the reference implementations do.

    Args:
        x: the vectors, (..., d).
        weight: the gain g, (d,).
        eps: added to the mean square before the root, a small positive number.

    Returns:
        The normalised vectors times g, (..., d), in x's dtype.

    Examples:
        >>> import torch
        >>> from selfattn.attention.layers import rms_norm
        >>> rms_norm(torch.tensor([[3.0, 4.0]]), torch.ones(2), eps=0.0)  # rms = sqrt(12.5)
        tensor([[0.8485, 1.1314]])
    """
    wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
    scaled = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True).add_(eps))  # (..., d) * (..., 1)
    tracked = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if not tracked and scaled.dtype == weight.dtype == x.dtype:
        # Without autograd the product above is ours to overwrite: scaling it in place
        # saves one (..., d) tensor per norm (a decoder runs 2 L + 1 of them per call).
        return scaled.mul_(weight)
    return weight * scaled.to(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain ``weight`` (d,), initialised to ones.   (..., d) -> (..., d)

    Args:
        d: the width of the vectors.
        eps: added to the mean square before the root (default 1e-6).
    """

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        """Create the gain; the class docstring describes the arguments."""
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g.   (..., d) -> (..., d)

        Args:
            x: (..., d).

        Returns:
            (..., d), see ``rms_norm``.
        """
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class GatedFeedForward(nn.Module):
    """SwiGLU(x) = (silu(x W_gate) * (x W_up)) W_down, on each position.   (..., d_model) -> (..., d_model)

    The parameters are ``gate``, ``up`` (d_model -> d_ff) and ``down`` (d_ff -> d_model).

    Args:
        d_model: width of the input and the output.
        d_ff: the hidden width.
        bias: whether the three projections have biases (default False, as in Llama).
    """

    def __init__(self, d_model: int, d_ff: int, bias: bool = False) -> None:
        """Create the three projections; the class docstring describes the arguments."""
        super().__init__()
        TransformerConfig(d_model, 1, d_ff=d_ff, activation="swiglu", bias=bias)  # validates
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU(x).   (..., d_model) -> (..., d_model)

        Args:
            x: (..., d_model).

        Returns:
            (silu(x W_gate) * (x W_up)) W_down, (..., d_model).
        """
        gate, up = self.gate(x), self.up(x)  # (..., d_ff) each
        if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
            return self.down(F.silu(gate) * up)  # (..., d_ff) * (..., d_ff) -> (..., d_model)
        # Without autograd both products can be overwritten: two (..., d_ff) tensors fewer.
        return self.down(F.silu(gate, inplace=True).mul_(up))  # (..., d_ff) -> (..., d_model)


def make_norm(config: TransformerConfig) -> nn.Module:
    """The block's normalisation: LayerNorm (with a bias when config.bias) or RMSNorm."""
    if config.norm == "rms":
        return RMSNorm(config.d_model, config.layer_norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.bias)
