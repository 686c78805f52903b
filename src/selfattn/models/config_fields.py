"""Reading a config.json field by field, with one-line errors that name the field.

A family's reader asks for each field it needs with its type (``int``, ``number``,
``bool``, ``choice``), and says which settings it refuses (``refuse_true``): a
checkpoint whose config asks for something our blocks do not compute is refused by
name instead of run wrongly.
"""

from __future__ import annotations

import math

from selfattn.errors import ModelError

_MISSING = object()


class ConfigReader:
    """Typed access to one parsed config.json of one family."""

    def __init__(self, data: dict, family: str) -> None:
        self.data = data
        self.family = family

    def _get(self, name: str, default):
        value = self.data.get(name, default)
        if value is _MISSING:
            raise ModelError(f"config.json of this {self.family} model lacks the field {name!r}")
        return value

    def _bad(self, name: str, value, wanted: str) -> ModelError:
        return ModelError(f"config.json field {name!r} must be {wanted}, got {value!r}")

    def int(self, name: str, default=_MISSING, allow_null: bool = False, minimum: int = 1) -> int:
        """A whole number >= minimum (a null takes the default when allow_null)."""
        value = self._get(name, default)
        if value is None and allow_null and default is not _MISSING:
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._bad(name, value, f"a whole number >= {minimum}")
        return value

    def number(self, name: str, default=_MISSING) -> float:
        """A finite positive number."""
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise self._bad(name, value, "a positive number")
        return float(value)

    def bool(self, name: str, default=_MISSING) -> bool:
        value = self._get(name, default)
        if not isinstance(value, bool):
            raise self._bad(name, value, "true or false")
        return value

    def choice(self, name: str, known: dict, default=_MISSING):
        """One of ``known``'s keys -> its value."""
        value = self._get(name, default)
        if value not in known:
            raise ModelError(
                f"config.json field {name!r} is {value!r}: selfattn's {self.family} supports {', '.join(map(repr, known))}"
            )
        return known[value]

    def optional_id(self, name: str) -> int | None:
        """A token id, or None when absent or null (a list takes its first id)."""
        value = self.data.get(name)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._bad(name, value, "a token id (a whole number >= 0) or null")
        return value

    def ids(self, name: str, default=None) -> tuple[int, ...]:
        """One id or a list of ids (eos_token_id may be either); () when null."""
        value = self.data.get(name, default)
        values = [] if value is None else value if isinstance(value, list) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise self._bad(name, value, "a token id or a list of token ids")
        return tuple(values)

    def divide(self, whole: int, parts: int, whole_name: str, parts_name: str) -> int:
        if whole % parts:
            raise ModelError(f"config.json: {whole_name} ({whole}) is not divisible by {parts_name} ({parts})")
        return whole // parts

    def refuse_true(self, name: str, what: str) -> None:
        """Refuse a config that switches ``name`` on."""
        if self.data.get(name):
            raise ModelError(
                f"config.json field {name!r} asks for {what}, which selfattn's {self.family} does not compute"
            )

    def require_true(self, name: str, what: str) -> None:
        """Refuse a config that switches ``name`` (default true) off."""
        if self.data.get(name, True) is not True:
            raise ModelError(
                f"config.json field {name!r} is {self.data.get(name)!r}: selfattn's {self.family} always uses {what}"
            )
