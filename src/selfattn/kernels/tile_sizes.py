"""The tile sizes a caller may give the kernels, checked without torch.

``flash_attention``'s block_q and block_k, and the flash variant's --block-size, are
positive ints or None (the kernel's own choice). Plain Python: the command line refuses
a bad --block-size before torch loads.
"""

from __future__ import annotations

from selfattn.errors import OptionError


def check_block_size(name: str, value, default: int | None) -> int | None:
    """A tile size: a positive int, or None for ``default``; anything else is an OptionError naming ``name``."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name} must be a positive integer, got {value!r}")
    return value
