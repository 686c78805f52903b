"""Numbers as the outputs write them: a leaf below every renderer.

``number_text`` writes one number for a table (fixed decimals, scientific notation where
fixed would run past 10 digits before the point or 10 zeros after it), ``plain`` turns tensors into nested lists of floats (non-finite ones as the strings
"inf", "-inf" and "nan", since JSON has none), ``rounded`` does so at a given number of
decimals, ``compact_json`` lays JSON out with each row of numbers on one line, and
``check_precision`` refuses a number of decimals out of range. The JSON writers, the
explorer's data and the commands' outputs share them.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from selfattn.errors import OptionError

MIN_PRECISION, MAX_PRECISION = 0, 10
# A number is written in scientific notation (1.0461e+29) where fixed notation would run
# wide: from 1e10 up it needs more than 10 digits before the point (exp of a score of 67),
# and below 1e-10 (not 0) more than 10 zeros after it before its first digit (exp(-69)).
SCIENTIFIC_FROM, SCIENTIFIC_BELOW = 1e10, 1e-10


def check_precision(precision: int) -> None:
    """OptionError unless ``precision`` is an int from MIN_PRECISION to MAX_PRECISION."""
    if isinstance(precision, bool) or not isinstance(precision, int) or not MIN_PRECISION <= precision <= MAX_PRECISION:
        raise OptionError(
            f"--precision must be an integer from {MIN_PRECISION} to {MAX_PRECISION}, got {precision!r}"
        )


def number_text(value: float, precision: int) -> str:
    """A number as the tables print it: ``precision`` decimals, or scientific where fixed would run wide.

    Fixed notation from SCIENTIFIC_BELOW (1e-10) up to SCIENTIFIC_FROM (1e10); outside
    that range (0 aside) a mantissa with ``precision`` decimals and an exponent, so a
    30-digit integer reads 1.0461e+29 and a weight of 4e-31 is not passed off as 0.
    Between, a number smaller than the precision shows rounds to 0 as asked. inf and NaN
    are spelled out, exact zeros stay 0.0000, and no '-0.0000' is written.

    Examples:
        >>> number_text(0.19191, 4), number_text(1.04606e29, 4), number_text(4.2e-31, 4), number_text(-0.0, 2)
        ('0.1919', '1.0461e+29', '4.2000e-31', '0.00')
    """
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if abs(value) >= SCIENTIFIC_FROM or 0 < abs(value) < SCIENTIFIC_BELOW:
        return f"{value:.{precision}e}"
    text = f"{value:.{precision}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.") else text


def plain(value: Any, precision: int | None = None) -> Any:
    """Tensors to nested lists of floats, non-finite floats to strings.

    With ``precision``, finite floats are rounded to that many decimals (and -0.0 becomes 0.0).
    """
    torch = sys.modules.get("torch")  # not loaded yet: no tensor can exist (the CLI checks --precision before torch loads)
    if torch is not None and isinstance(value, torch.Tensor):
        if value.is_floating_point():  # the common case, row by row: a 512-token page holds millions of floats
            return _float_rows(value.tolist(), value.dim(), precision)
        value = value.tolist()
    if isinstance(value, float):
        return _plain_float(value, precision)
    if isinstance(value, (list, tuple)):
        return [plain(v, precision) for v in value]
    if isinstance(value, dict):
        return {k: plain(v, precision) for k, v in value.items()}
    return value


def _plain_float(value: float, precision: int | None):
    """One float as ``plain`` writes it: "nan", "inf" or "-inf", else rounded (no -0.0) with ``precision``."""
    if not math.isfinite(value):
        return _non_finite(value)
    if precision is None:
        return value
    return round(value, precision) or 0.0  # -0.0 (and 0.0) is falsy: written 0.0


def _non_finite(value: float) -> str:
    return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"


def _float_rows(values, depth: int, precision: int | None):
    """A float tensor's ``tolist()`` (``depth`` = its dimensions) with each float as ``_plain_float`` writes it."""
    if depth == 0:
        return _plain_float(values, precision)
    if depth > 1:
        return [_float_rows(row, depth - 1, precision) for row in values]
    isfinite = math.isfinite
    if precision is None:
        return [v if isfinite(v) else _non_finite(v) for v in values]
    return [(round(v, precision) or 0.0) if isfinite(v) else _non_finite(v) for v in values]


def rounded(value: Any, precision: int) -> Any:
    """Tensors to nested lists rounded to ``precision`` decimals; -inf / inf / nan as strings."""
    return plain(value, precision)


def compact_json(value: Any, indent: int = 0) -> str:
    """json.dumps with nesting indented, but each list of numbers kept on one line."""
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f'{pad}  {json.dumps(k)}: {compact_json(v, indent + 1)}' for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        rows = [f"{pad}  {compact_json(v, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(rows) + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)
