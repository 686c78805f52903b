"""Numbers as the outputs write them: a leaf below every renderer.

``plain`` turns tensors into nested lists of floats (non-finite ones as the strings
"inf", "-inf" and "nan", since JSON has none), ``rounded`` does so at a given number of
decimals, ``compact_json`` lays JSON out with each row of numbers on one line, and
``check_precision`` refuses a number of decimals out of range. The JSON writers, the
explorer's data and the commands' outputs share them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from selfattn.errors import OptionError

MIN_PRECISION, MAX_PRECISION = 0, 10


def check_precision(precision: int) -> None:
    """OptionError unless ``precision`` is an int from MIN_PRECISION to MAX_PRECISION."""
    if isinstance(precision, bool) or not isinstance(precision, int) or not MIN_PRECISION <= precision <= MAX_PRECISION:
        raise OptionError(
            f"--precision must be an integer from {MIN_PRECISION} to {MAX_PRECISION}, got {precision!r}"
        )


def plain(value: Any, precision: int | None = None) -> Any:
    """Tensors to nested lists of floats, non-finite floats to strings.

    With ``precision``, finite floats are rounded to that many decimals (and -0.0 becomes 0.0).
    """
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if precision is None:
            return value
        value = round(value, precision)
        return 0.0 if value == 0 else value  # no "-0.0"
    if isinstance(value, (list, tuple)):
        return [plain(v, precision) for v in value]
    if isinstance(value, dict):
        return {k: plain(v, precision) for k, v in value.items()}
    return value


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
