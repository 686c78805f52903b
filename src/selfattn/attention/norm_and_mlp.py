"""The pieces later decoder families put around attention: RMSNorm and the gated feed-forward.

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g                 Zhang and Sennrich 2019
    SwiGLU(x)  = (silu(x W_gate) * (x W_up)) W_down,  silu(z) = z sigmoid(z)    Shazeer 2020
    GeGLU(x)   = (gelu(x W_gate) * (x W_up)) W_down,  gelu in its tanh form     Shazeer 2020

RMSNorm drops LayerNorm's centring and bias: it only rescales each vector to unit root
mean square and multiplies by a learned gain: g = w (Llama, Qwen), or g = 1 + w (Gemma,
whose checkpoints store w near 0). The gated feed-forward multiplies two projections of
x, one through silu (or GELU), before projecting back. Llama, Mistral and Qwen use SwiGLU,
Gemma GeGLU; GPT-2 uses LayerNorm and GELU (tanh form) in ``FeedForward``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from selfattn.attention.config import GATED_ACTIVATIONS, NORM_GAINS, TransformerConfig
from selfattn.errors import ConfigError

# The gate's nonlinearity of each gated unit.
_GATES = {"swiglu": F.silu, "geglu_tanh": lambda z: F.gelu(z, approximate="tanh")}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, gain: str = "w") -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * g, over the last axis, g = w or 1 + w.   (..., d), (d,) -> (..., d)

    Computed in float32 at least (half-precision inputs are upcast for the mean of
    squares, then cast back), as the reference implementations do. With gain "1+w" the
    product with 1 + w is taken in that wide dtype too, before the cast back (Gemma's
    order; Llama's casts first, then multiplies by w).

    Args:
        x: the vectors, (..., d).
        weight: the learned w, (d,).
        eps: added to the mean square before the root, a small positive number.
        gain: "w" (default): g = w; "1+w": g = 1 + w.

    Returns:
        The normalised vectors times g, (..., d), in x's dtype.

    Examples:
        >>> import torch
        >>> from selfattn.attention.norm_and_mlp import rms_norm
        >>> rms_norm(torch.tensor([[3.0, 4.0]]), torch.ones(2), eps=0.0)  # rms = sqrt(12.5)
        tensor([[0.8485, 1.1314]])
        >>> rms_norm(torch.tensor([[3.0, 4.0]]), torch.zeros(2), eps=0.0, gain="1+w")  # g = 1 + 0
        tensor([[0.8485, 1.1314]])
    """
    wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
    scaled = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True).add_(eps))  # (..., d) * (..., 1)
    tracked = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if gain == "1+w":
        g = 1.0 + weight.to(scaled.dtype)  # (d,)
        return (scaled * g if tracked else scaled.mul_(g)).to(x.dtype)
    if not tracked and scaled.dtype == weight.dtype == x.dtype:
        # Without autograd the product above is ours to overwrite: scaling it in place
        # saves one (..., d) tensor per norm (a decoder runs 2 L + 1 of them per call).
        return scaled.mul_(weight)
    return weight * scaled.to(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm with a learned ``weight`` w (d,); the gain is w or 1 + w.   (..., d) -> (..., d)

    w starts so that the gain is 1: ones for "w", zeros for "1+w".

    Args:
        d: the width of the vectors.
        eps: added to the mean square before the root (default 1e-6).
        gain: "w" (default) or "1+w" (Gemma), see ``rms_norm``.

    Raises:
        ConfigError: the gain is not one of ``NORM_GAINS``.
    """

    def __init__(self, d: int, eps: float = 1e-6, gain: str = "w") -> None:
        """Create the gain; the class docstring describes the arguments."""
        super().__init__()
        if gain not in NORM_GAINS:
            raise ConfigError(f"unknown norm gain {gain!r}: choose one of {', '.join(NORM_GAINS)}")
        self.eps = eps
        self.gain = gain
        self.weight = nn.Parameter(torch.ones(d) if gain == "w" else torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g.   (..., d) -> (..., d)

        Args:
            x: (..., d).

        Returns:
            (..., d), see ``rms_norm``.
        """
        return rms_norm(x, self.weight, self.eps, self.gain)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}" + (f", gain={self.gain!r}" if self.gain != "w" else "")


class GatedFeedForward(nn.Module):
    """(act(x W_gate) * (x W_up)) W_down, on each position.   (..., d_model) -> (..., d_model)

    act is silu (SwiGLU, "swiglu") or the tanh form of GELU (GeGLU, "geglu_tanh"). The
    parameters are ``gate``, ``up`` (d_model -> d_ff) and ``down`` (d_ff -> d_model).

    Args:
        d_model: width of the input and the output.
        d_ff: the hidden width.
        bias: whether the three projections have biases (default False, as in Llama).
        activation: "swiglu" (default) or "geglu_tanh".

    Raises:
        ConfigError: a width is not a positive integer, or the activation is not gated.
    """

    def __init__(self, d_model: int, d_ff: int, bias: bool = False, activation: str = "swiglu") -> None:
        """Create the three projections; the class docstring describes the arguments."""
        super().__init__()
        TransformerConfig(d_model, 1, d_ff=d_ff, activation=activation, bias=bias)  # validates
        if activation not in GATED_ACTIVATIONS:
            raise ConfigError(f"GatedFeedForward takes {', '.join(GATED_ACTIVATIONS)}; {activation!r} is FeedForward's")
        self.activation = activation
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(act(x W_gate) * (x W_up)) W_down.   (..., d_model) -> (..., d_model)

        Args:
            x: (..., d_model).

        Returns:
            (act(x W_gate) * (x W_up)) W_down, (..., d_model).
        """
        gate, up = self.gate(x), self.up(x)  # (..., d_ff) each
        act = _GATES[self.activation]
        if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
            return self.down(act(gate) * up)  # (..., d_ff) * (..., d_ff) -> (..., d_model)
        # Without autograd the products can be overwritten: (..., d_ff) tensors fewer.
        hidden = F.silu(gate, inplace=True) if self.activation == "swiglu" else act(gate)  # (..., d_ff)
        return self.down(hidden.mul_(up))  # (..., d_ff) -> (..., d_model)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


def make_norm(config: TransformerConfig) -> nn.Module:
    """The block's normalisation: LayerNorm (with a bias when config.bias) or RMSNorm (with its gain)."""
    if config.norm == "rms":
        return RMSNorm(config.d_model, config.norm_eps, config.norm_gain)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)
