"""Ways to tell attention where each token sits; attention itself is order-blind.

Three families, by where they act:

    ADDITIVE ("sinusoidal", "learned")  X + P: a (seq, d_model) table added to the embeddings
    ROTARY   ("rope")                    q, k turned by a position-dependent rotation
    BIASED   ("alibi")                   scores + bias: a distance penalty per head

"none" leaves attention permutation-equivariant, as in the seed.
"""

from __future__ import annotations

from selfattn.errors import OptionError
from selfattn.positional.alibi import alibi_bias, alibi_slopes
from selfattn.positional.learned import LearnedPositionalEmbedding
from selfattn.positional.rope import apply_rope, rope_angles, rope_distance_check
from selfattn.positional.sinusoidal import sinusoidal_encoding

POSITIONAL_NAMES = ("none", "sinusoidal", "learned", "rope", "alibi")
ADDITIVE = ("sinusoidal", "learned")
ROTARY = "rope"
BIASED = "alibi"


def check_positional(name: str | None) -> str:
    """Return ``name`` if it is a known positional encoding; None means "none".

    Args:
        name: one of ``POSITIONAL_NAMES``, or None.

    Returns:
        ``name``, or "none" for None.

    Raises:
        OptionError: ``name`` is not a known positional encoding.
    """
    if name is None:
        return "none"
    if name not in POSITIONAL_NAMES:
        raise OptionError(f"unknown positional encoding {name!r}: choose one of {', '.join(POSITIONAL_NAMES)}")
    return name


__all__ = [
    "ADDITIVE",
    "BIASED",
    "POSITIONAL_NAMES",
    "ROTARY",
    "LearnedPositionalEmbedding",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "check_positional",
    "rope_angles",
    "rope_distance_check",
    "sinusoidal_encoding",
]
