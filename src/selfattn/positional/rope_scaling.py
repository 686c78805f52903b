"""RoPE's frequencies, and the one rescaling of them that the small public checkpoints use.

    theta_i = base^(-2i/d_head),  i = 0 .. d_head/2 - 1        the paper's frequencies

Llama 3.1 and 3.2 stretch RoPE to longer contexts than they were first trained on with
"llama3" scaling (``config.json``'s rope_scaling / rope_parameters, rope_type "llama3").
Each frequency's wavelength lambda_i = 2 pi / theta_i is compared with the original
context L (original_max_position_embeddings):

    lambda_i < L / high_freq_factor     kept:          theta_i
    lambda_i > L / low_freq_factor      slowed down:   theta_i / factor
    in between                          a blend:       (1 - s) theta_i / factor + s theta_i,
                                                       s = (L / lambda_i - low) / (high - low)

so the fast pairs (short wavelengths, local order) stay as trained and only the slow
ones, which never completed a turn inside L, are spread further.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from selfattn.errors import OptionError


@dataclass(frozen=True)
class Llama3RopeScaling:
    """The "llama3" rescaling of RoPE's frequencies (Llama 3.1 / 3.2).

    Attributes:
        factor: how much the slow frequencies are divided by (32 in Llama 3.2).
        low_freq_factor: wavelengths above L / low_freq_factor are divided by factor.
        high_freq_factor: wavelengths below L / high_freq_factor are kept.
        original_max_position_embeddings: L, the context the model was first trained on.

    Raises:
        OptionError: a factor is not a positive number, high_freq_factor is not above
            low_freq_factor, or L is not a positive integer.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise OptionError(f"rope scaling: {name} must be a positive number, got {value!r}")
        if not self.high_freq_factor > self.low_freq_factor:
            raise OptionError(
                f"rope scaling: high_freq_factor ({self.high_freq_factor}) must be above "
                f"low_freq_factor ({self.low_freq_factor})"
            )
        length = self.original_max_position_embeddings
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise OptionError(f"rope scaling: original_max_position_embeddings must be a positive integer, got {length!r}")

    def rescale(self, theta: torch.Tensor) -> torch.Tensor:
        """The rescaled frequencies, by wavelength as in the module docstring.   (d_head/2,) -> (d_head/2,)

        Args:
            theta: RoPE's frequencies theta_i, (pairs,).

        Returns:
            The frequencies after scaling, (pairs,), in theta's dtype.
        """
        wavelength = 2 * math.pi / theta  # (pairs,)
        context = self.original_max_position_embeddings
        slowed = theta / self.factor
        blend = (context / wavelength - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        blended = (1 - blend) * slowed + blend * theta
        out = torch.where(wavelength > context / self.low_freq_factor, slowed, theta)
        middle = (wavelength >= context / self.high_freq_factor) & (wavelength <= context / self.low_freq_factor)
        return torch.where(middle, blended, out)


def rope_frequencies(
    d_head: int, base: float = 10000.0, scaling: Llama3RopeScaling | None = None, device=None
) -> torch.Tensor:
    """theta_i = base^(-2i/d_head), rescaled when ``scaling`` is given.   -> (d_head // 2,) float64

    Args:
        d_head: the rotated width, even and at least 2.
        base: the frequency base (rope_theta in a config.json); default 10000.
        scaling: None, or a ``Llama3RopeScaling``.
        device: where the tensor lives.

    Returns:
        The d_head / 2 frequencies in float64, one per feature pair.

    Examples:
        >>> from selfattn.positional.rope_scaling import Llama3RopeScaling, rope_frequencies
        >>> rope_frequencies(4).tolist()
        [1.0, 0.01]
        >>> slow = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        ...                          original_max_position_embeddings=16)
        >>> [round(f, 6) for f in rope_frequencies(4, scaling=slow).tolist()]  # the fast pair is kept
        [1.0, 0.00125]
    """
    pair = torch.arange(0, d_head, 2, dtype=torch.float64, device=device)  # (d_head/2,): 2i
    theta = torch.pow(torch.tensor(base, dtype=torch.float64, device=device), -pair / d_head)
    return theta if scaling is None else scaling.rescale(theta)
