"""One file per model family, named after config.json's model_type; each defines ``FAMILY``.

The registry (``selfattn.models.registry``) lists this folder, so a new family is one new
file here (and its test). Llama-shaped families build their record with
``selfattn.models.llama_layout.llama_family`` and state only how they differ. This
package imports nothing but ``pathlib`` and ``re``, so listing it (``family_names``, and
``family_kinds`` from each file's ``KIND`` line, for the command line's help and its
messages) imports no torch and no family; the registry checks each ``KIND`` against the
family's own record when it imports the file.
"""

from __future__ import annotations

import re
from pathlib import Path

# A family file's line ``KIND = "encoder"`` or ``KIND = "decoder"``, read as text.
_KIND_LINE = re.compile(r'^KIND = "(\w+)"', re.M)


def family_names() -> tuple[str, ...]:
    """The registered model_types, sorted: the names of the family files in this folder.

    Returns:
        The model_types, sorted (the keys of ``selfattn.models.FAMILIES``, in its order).
    """
    return tuple(sorted(p.stem for p in Path(__file__).parent.glob("*.py") if not p.stem.startswith("_")))


def family_kinds() -> dict[str, str]:
    """model_type -> "encoder" or "decoder", from each family file's ``KIND`` line, without importing it.

    Returns:
        The kinds, in ``family_names`` order.
    """
    folder = Path(__file__).parent
    kinds = {}
    for name in family_names():
        found = _KIND_LINE.search((folder / f"{name}.py").read_text(encoding="utf-8"))
        kinds[name] = found.group(1) if found else "unknown"  # the registry refuses a file without it
    return kinds


def decoder_family_names() -> tuple[str, ...]:
    """The model_types of the decoder families (they generate), sorted, without importing them."""
    return tuple(name for name, kind in family_kinds().items() if kind == "decoder")
