"""Ways to tell attention where each token sits; attention itself is order-blind.

Three families, by where they act:

    ADDITIVE ("sinusoidal", "learned")  X + P: a (seq, d_model) table added to the embeddings
    ROTARY   ("rope")                    q, k turned by a position-dependent rotation
    BIASED   ("alibi")                   scores + bias: a distance penalty per head

"none" leaves attention permutation-equivariant, as in the seed.

The names and ``check_positional`` are plain Python (the command line checks --positional
before torch loads); the encodings load on first use.
"""

from __future__ import annotations

from selfattn.lazy import lazy_names

from selfattn.errors import OptionError, did_you_mean

_ENCODINGS = {
    "alibi_bias": "selfattn.positional.alibi",
    "alibi_slopes": "selfattn.positional.alibi",
    "LearnedPositionalEmbedding": "selfattn.positional.learned",
    "apply_rope": "selfattn.positional.rope",
    "rope_angles": "selfattn.positional.rope",
    "rope_distance_check": "selfattn.positional.rope",
    "sinusoidal_encoding": "selfattn.positional.sinusoidal",
}

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
        raise OptionError(f"unknown positional encoding {name!r}: choose one of {', '.join(POSITIONAL_NAMES)}"
                          f"{did_you_mean(name, POSITIONAL_NAMES)}")
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


__getattr__, __dir__ = lazy_names(globals(), _ENCODINGS)
