"""One file per model family, named after config.json's model_type; each defines ``FAMILY``.

The registry (``selfattn.models.registry``) lists this folder, so a new family is one new
file here (and its test). Llama-shaped families build their record with
``selfattn.models.llama_layout.llama_family`` and state only how they differ. This
package imports nothing but ``pathlib``, so listing it (``family_names``, for the command
line's help) imports no torch and no family.
"""

from __future__ import annotations

from pathlib import Path


def family_names() -> tuple[str, ...]:
    """The registered model_types, sorted: the names of the family files in this folder.

    Returns:
        The model_types, sorted (the keys of ``selfattn.models.FAMILIES``, in its order).
    """
    return tuple(sorted(p.stem for p in Path(__file__).parent.glob("*.py") if not p.stem.startswith("_")))
