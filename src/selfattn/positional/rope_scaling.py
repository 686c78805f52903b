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

A GGUF file of Llama 3.1 / 3.2 states none of these settings: llama.cpp's converter stores
the result instead, one divisor per pair (the tensor rope_freqs: theta_i / divisor_i is
the frequency used). ``Llama3RopeScaling.from_divisors`` reads the settings back from
those divisors and checks that they give every divisor again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from selfattn.errors import OptionError

# How close (relative) frequencies read back from stored divisors must come to the file's: the
# divisors are float32, computed by llama.cpp's converter from float32 frequencies.
DIVISOR_RTOL = 1e-5


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

    @classmethod
    def from_divisors(cls, divisors, d_head: int, base: float) -> Llama3RopeScaling | None:
        """The scaling whose frequencies are theta_i / divisor_i (llama.cpp's rope_freqs).   (d_head/2,) -> scaling

        Only factor and the two wavelengths L / high_freq_factor and L / low_freq_factor
        shape the frequencies, so low_freq_factor is taken as 1 (as in every Llama 3): the
        slowest divisor is factor, and on the blended pairs s = (1/divisor - 1/factor) /
        (1 - 1/factor) falls on the line s = L / ((high - low) lambda) - low / (high - low),
        read at the first and last of them. With fewer than two blended pairs Meta's
        settings (low 1, high 4, L 8192) are tried. Either way the result must give every
        frequency theta_i / divisor_i back (relative ``DIVISOR_RTOL``), or this raises.

        Args:
            divisors: d_head / 2 numbers, one per pair, fastest pair first.
            d_head: the rotated width.
            base: RoPE's frequency base.

        Returns:
            The ``Llama3RopeScaling``, or None when every divisor is 1 (no scaling).

        Raises:
            OptionError: the count is not d_head / 2, a divisor is not a positive finite
                number, or no llama3 scaling gives these divisors.

        Examples:
            >>> meta = Llama3RopeScaling(32.0, 1.0, 4.0, 8192)  # Llama 3.2's
            >>> divisors = rope_frequencies(64, 500000.0) / rope_frequencies(64, 500000.0, meta)
            >>> Llama3RopeScaling.from_divisors(divisors.float(), 64, 500000.0) == meta
            True
        """
        divisors = torch.as_tensor(divisors, dtype=torch.float64).flatten()  # (pairs,)
        if divisors.numel() != d_head // 2:
            raise OptionError(f"{divisors.numel()} frequency divisors for the {d_head // 2} pairs of a "
                              f"{d_head}-wide head")
        if not bool(torch.isfinite(divisors).all()) or not bool((divisors > 0).all()):
            raise OptionError("the frequency divisors must be positive finite numbers")
        theta = rope_frequencies(d_head, base)  # (pairs,)
        want = theta / divisors
        if torch.allclose(want, theta, rtol=DIVISOR_RTOL, atol=0):
            return None
        factor = float(divisors.max())
        wavelength = 2 * math.pi / theta  # (pairs,)
        kept = (1 / divisors - 1 / factor) / (1 - 1 / factor)  # s: 0 slowed down, 1 kept
        blended = ((divisors > 1 + DIVISOR_RTOL) & (divisors < factor * (1 - DIVISOR_RTOL))).nonzero().flatten()
        context, high = 8192.0, 4.0
        if blended.numel() >= 2:
            first, last = int(blended[0]), int(blended[-1])
            # s = slope / lambda - offset, slope = L / (high - low), offset = low / (high - low)
            slope = float((kept[first] - kept[last]) / (1 / wavelength[first] - 1 / wavelength[last]))
            offset = slope / float(wavelength[first]) - float(kept[first])
            context, high = (slope / offset, (1 + offset) / offset) if offset > 0 else (math.nan, math.nan)
        scaling = None
        if math.isfinite(context) and math.isfinite(high) and context >= 1:
            try:
                scaling = cls(factor, 1.0, round(high, 3), round(context))
            except OptionError:
                pass
        if scaling is None or not torch.allclose(scaling.rescale(theta), want, rtol=DIVISOR_RTOL, atol=0):
            raise OptionError("the frequency divisors are not those of a llama3 scaling")
        return scaling


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
        ...                          original_max_position_embeddings=32)
        >>> [round(f, 6) for f in rope_frequencies(4, scaling=slow).tolist()]  # the fast pair is kept
        [1.0, 0.00125]
    """
    pair = torch.arange(0, d_head, 2, dtype=torch.float64, device=device)  # (d_head/2,): 2i
    theta = torch.pow(torch.tensor(base, dtype=torch.float64, device=device), -pair / d_head)
    return theta if scaling is None else scaling.rescale(theta)
