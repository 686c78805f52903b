"""One loaded copy of each model per process, with a short notice while it loads.

A model is named by its built-in name (all-MiniLM-L6-v2), a folder, a llama2.c checkpoint
file (with its tokenizer beside it or named), or a hub id found in the local cache
(``locate.model_key`` resolves it; the loaders are imported with the first load, so the
command line resolves a name before torch loads). When stdout is a terminal, a
one-line spinner on stderr says it is happening (and vanishes); piped or captured output
gets nothing, and neither does a stderr redirected to a file, so files stay clean.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from selfattn.models import locate


# What the command line named for a model, by model key: (the tokenizer file of a llama2.c
# checkpoint, --tokenizer; the weight type of a GGUF model, --dtype), None where not named.
_named: dict[str, tuple[str | None, str | None]] = {}


@contextmanager
def named_options(name_or_path, tokenizer=None, dtype: str | None = None):
    """Inside the block, load the model ``name_or_path`` with the tokenizer file ``tokenizer`` and weight type ``dtype``.

    The command line's ``--tokenizer FILE`` and ``--dtype``: set around one command, so that
    every ``shared_model(name_or_path)`` of that command loads the model with them; after
    the block (also after an error) the name loads as before.

    Raises:
        ModelError: the model cannot be resolved (as ``model_key``).
    """
    key = locate.model_key(name_or_path)
    before = _named.get(key)
    _named[key] = (None if tokenizer is None else str(Path(tokenizer).expanduser().resolve()), dtype)
    try:
        yield
    finally:
        if before is None:
            _named.pop(key, None)
        else:
            _named[key] = before


def shared_model(name_or_path, key: str | None = None):
    """The model ``name_or_path``, loaded once per process (frozen, eval mode).

    ``key``: its ``model_key``, when the caller has resolved the name already (an
    ``ExplainConfig`` does when it is built), so that the name is resolved once. A
    model loads with the tokenizer file and weight type ``named_options`` names for it, if any.
    """
    key = locate.model_key(name_or_path) if key is None else key
    tokenizer, dtype = _named.get(key, (None, None))
    return _load(key, os.fspath(name_or_path), tokenizer, dtype or "float32")


@lru_cache(maxsize=2)
def _load(key: str, shown: str, tokenizer: str | None = None, dtype: str = "float32"):
    from selfattn.models.pretrained import load_pretrained

    if not (sys.stdout.isatty() and sys.stderr.isatty()):
        return load_pretrained(_name(key, shown), tokenizer, dtype)
    from rich.console import Console

    with Console(stderr=True).status(f"loading {shown} ...", spinner="dots"):
        return load_pretrained(_name(key, shown), tokenizer, dtype)


def _name(key: str, shown: str) -> str:
    """A hub id loads by that id (the model keeps it as its name); a built-in name, a folder or a file by its key."""
    return shown if Path(key).is_absolute() and not Path(shown).expanduser().exists() else key
