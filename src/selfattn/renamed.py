"""Old keyword and attribute names that keep working for one release, with a DeprecationWarning.

``renamed_keyword(cls, old, new)`` lets a class take ``old=`` for its parameter ``new`` and
read ``.old``; ``renamed_attribute(cls, old, new)`` only the reading, for a name that was
never a parameter. Every rename of a public name goes through them, so the warnings read
alike and the CHANGELOG lists them.
"""

from __future__ import annotations

import functools
import inspect
import warnings

from selfattn.errors import ConfigError


def renamed_keyword(cls: type, old: str, new: str) -> type:
    """Let a class take ``old=`` for its parameter ``new`` (and read ``.old``), with a DeprecationWarning.

    Giving both names, by keyword or ``new`` by position, is a ConfigError.

    Args:
        cls: the class (a dataclass, a module).
        old: the parameter's former name.
        new: its name now.

    Returns:
        ``cls``, whose constructor maps ``old`` onto ``new`` and which has a read-only ``old``
            property.
    """
    init = cls.__init__
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if old in kwargs:
            warnings.warn(f"{cls.__name__}({old}=...) is now {new}=...", DeprecationWarning, stacklevel=2)
            value = kwargs.pop(old)
            if new in signature.bind_partial(self, *args, **kwargs).arguments:
                raise ConfigError(f"give {new} only: {old} is its old name")
            kwargs[new] = value
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return renamed_attribute(cls, old, new)


def renamed_attribute(cls: type, old: str, new: str) -> type:
    """Let a class's instances answer ``.old`` with ``.new``, with a DeprecationWarning.

    Args:
        cls: the class.
        old: the attribute's former name.
        new: its name now.

    Returns:
        ``cls``, with a read-only ``old`` property.
    """
    def read_old(self):
        warnings.warn(f"{cls.__name__}.{old} is now .{new}", DeprecationWarning, stacklevel=2)
        return getattr(self, new)

    setattr(cls, old, property(read_old, doc=f"The old name of ``{new}`` (deprecated)."))
    return cls
