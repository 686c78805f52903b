"""Packages whose names load on first use (PEP 562), so that importing one loads nothing heavy.

``import selfattn`` and the packages the command line checks its arguments with
(``pipeline``, ``positional``, ``kernels``, ``training``, ``models``) import no torch: each
maps its public names to the modules that define them, and a name's module is imported the
first time the name is read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_names(namespace: dict, exports: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for ``exports``.

    Args:
        namespace: the package's ``globals()``; a name read once is kept there, so later
            reads are plain lookups.
        exports: each name -> the module that defines it.

    Returns:
        (``__getattr__``, ``__dir__``), to assign in the package.

    Examples:
        >>> import selfattn.pipeline as pipeline  # its __init__: __getattr__, __dir__ = lazy_names(...)
        >>> "tokenize" in dir(pipeline), pipeline.tokenize("a b")
        (True, ['a', 'b'])
    """
    package = namespace["__name__"]

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
