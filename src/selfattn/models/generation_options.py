"""How much to generate and how to draw each token, checked before a model loads.

Plain Python: ``generate`` checks its options with these, and the command line does so
before torch loads, so ``selfattn generate x --max-new-tokens 100000000000`` is one line
at once.
"""

from __future__ import annotations

import math

from selfattn.errors import OptionError

MAX_NEW_TOKENS = 10_000  # the most one call may ask for: past the window nothing else bounds a typo's run


def check_generation_options(max_new_tokens, temperature, top_k, top_p, seed) -> None:
    """Raise ``OptionError`` for the first option out of range (the message gives the range)."""
    whole = isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool)
    if not whole or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise OptionError(f"max_new_tokens must be a whole number from 1 to {MAX_NEW_TOKENS}, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
        math.isfinite(temperature) and temperature >= 0
    ):
        raise OptionError(f"temperature must be a number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise OptionError(f"top_k must be a whole number >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise OptionError(f"top_p must be a number in (0, 1], got {top_p!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise OptionError(f"seed must be a whole number >= 0, got {seed!r}")
