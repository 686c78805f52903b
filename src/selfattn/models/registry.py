"""The model families selfattn loads: one file each in ``models/families/``, found by listing that folder.

A family file is named after config.json's model_type and defines ``FAMILY``, a
``Family``. Adding a family is adding its file (and its test); nothing here lists them.

Importing this module imports no torch: ``family_names`` reads the file names only (for
the command line's help), and ``FAMILIES`` imports the family files the first time it is
read.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from selfattn.models.families import family_names
from selfattn.models.family import Family

PACKAGE = "selfattn.models.families"

_registry: dict[str, Family] | None = None


def family_of(module: ModuleType, name: str) -> Family:
    """The ``FAMILY`` a family file defines, checked against the file's name.

    Args:
        module: the imported family file.
        name: its file name, which must be the family's model_type.

    Returns:
        The module's ``Family``.

    Raises:
        TypeError: the module has no ``FAMILY``, it names another model_type, or its
            ``KIND`` is not the family's kind (a bug in the family file, not in the
            user's input).
    """
    family = getattr(module, "FAMILY", None)
    if not isinstance(family, Family) or family.model_type != name:
        raise TypeError(f"{module.__name__} must define FAMILY, a Family whose model_type is its file's name {name!r}")
    if getattr(module, "KIND", None) != family.kind:  # the command line's help reads KIND without importing
        raise TypeError(f"{module.__name__} must define KIND = {family.kind!r}, the kind of its FAMILY")
    return family


def families() -> dict[str, Family]:
    """model_type -> ``Family`` for every family file, sorted by name; imported once, then cached.

    Returns:
        The registry itself (the same dict on every call; ``selfattn.models.FAMILIES``).
    """
    global _registry
    if _registry is None:
        _registry = {name: family_of(importlib.import_module(f"{PACKAGE}.{name}"), name) for name in family_names()}
    return _registry


def gguf_families() -> dict[str, Family]:
    """GGUF architecture -> the family that runs it, for every family with a ``gguf`` map.

    Returns:
        The families that read GGUF files, by the ``general.architecture`` each takes.
    """
    return {family.gguf.architecture: family for family in families().values() if family.gguf is not None}


def decoder_names() -> tuple[str, ...]:
    """The registered decoders' model_types, sorted: the families that generate.

    Returns:
        The model_types of the families whose kind is "decoder".
    """
    return tuple(name for name, family in families().items() if family.kind == "decoder")


def one_of(names: tuple[str, ...]) -> str:
    """Names as a sentence lists alternatives: "a, b or c".

    Args:
        names: the names, in order.

    Returns:
        The names joined by commas, the last by "or"; a single name as it is.
    """
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def __getattr__(name: str):
    # FAMILIES is built on first use, so that importing the registry stays cheap.
    if name == "FAMILIES":
        return families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
