"""One loaded copy of each pretrained model per process, with a short notice while it loads.

Loading all-MiniLM-L6-v2 reads 90 MB and builds the network: about a second. When
stdout is a terminal, a one-line spinner on stderr says it is happening (and vanishes);
piped or captured output gets nothing, and neither does a stderr redirected to a file,
so files stay clean.
"""

from __future__ import annotations

import sys
from functools import lru_cache

from selfattn.models.bert import BertModel, load_pretrained
from selfattn.models.files import model_spec


def shared_model(name: str) -> BertModel:
    """The pretrained model ``name``, loaded once per process (frozen, eval mode)."""
    return _load(model_spec(name).name)


@lru_cache(maxsize=2)
def _load(name: str) -> BertModel:
    if not (sys.stdout.isatty() and sys.stderr.isatty()):
        return load_pretrained(name)
    from rich.console import Console

    with Console(stderr=True).status(f"loading {name} ...", spinner="dots"):
        return load_pretrained(name)
