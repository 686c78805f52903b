"""Where a model lives on disk, found from its name alone: no torch, no weights, never the network.

The rules, in order:

- A built-in name (all-MiniLM-L6-v2, tiny-induction, tiny-shakespeare, stories260K; any
  capitalisation) is the model selfattn or an installed package ships (``files``).
- A file is a llama2.c checkpoint.
- A folder in the Hugging Face layout (``config.json``, the weights and usually
  ``tokenizer.json``) is used as it is.
- A hub id ``org/name`` that is not a folder here is looked up in the local Hugging Face
  cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``${XDG_CACHE_HOME:-~/.cache}/huggingface/hub``): ``models--org--name/refs/main`` names
  the snapshot whose files we read. Nothing is ever downloaded; the error says how to
  fetch the model once.

``model_key`` applies them; the command line calls it before torch loads, so a model that
is not there is one line at once. ``checkpoint`` reads the weights once a model is found.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from selfattn.errors import ModelError, did_you_mean
from selfattn.models.families import decoder_family_names, family_names
from selfattn.models.files import ALIASES, MODELS, model_spec
from selfattn.models.gguf_layout import looks_like_gguf
from selfattn.models.ollama import is_ollama, ollama_blob

LAYOUT = "a model folder in the Hugging Face layout holds config.json, the weights (model.safetensors ...) and tokenizer.json"

# One part of a hub id: the hub's characters, not starting with "." or "-", and without
# "--" or ".." (the cache joins org and name with "--", so a name holding it is ambiguous).
_HUB_PART = re.compile(r"(?!.*(?:--|\.\.))[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def find_model_folder(name_or_path: str | os.PathLike) -> Path:
    """The folder holding a model's files: a local folder, or a hub id's snapshot in the local cache.

    Args:
        name_or_path: a folder (``~`` is expanded) or a hub id like ``"org/name"`` that
            was fetched before into the Hugging Face cache.

    Returns:
        The folder with ``config.json`` and the weights.

    Raises:
        ModelError: the argument is not a string or path, the folder has no
            ``config.json``, the path is a file, or the hub id is not in the cache (the
            message names the cache folder it looked in).
    """
    text = os.fspath(name_or_path) if isinstance(name_or_path, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text.strip():
        shown = type(name_or_path).__name__ if not isinstance(text, str) else repr(text)
        raise ModelError(f"the model must be a folder or a hub id like 'org/name', got {shown}")
    path = Path(text).expanduser()
    if path.is_dir():
        return _checked_model_folder(path)
    if path.exists():
        raise ModelError(f"{path} is a file, not a folder: give the model's folder (the one holding config.json and the weights)")
    if _is_hub_id(text):
        return _cached_snapshot(text)
    raise ModelError(
        f"model {text!r} is not a folder here (no such path {path.absolute()}) and not a hub id like 'org/name'; {LAYOUT}"
    )


def read_config(folder: Path) -> dict:
    """The model's ``config.json`` as a dict.

    Args:
        folder: the model folder, as ``find_model_folder`` gives it.

    Returns:
        The parsed JSON object.

    Raises:
        ModelError: the file is missing, unreadable, not JSON, or not a JSON object.
    """
    path = Path(folder) / "config.json"
    config = read_json(path)
    if not isinstance(config, dict):
        raise ModelError(f"{path} holds a JSON {type(config).__name__}, not an object of settings")
    return config


def find_cached(name: str) -> Path | None:
    """A hub id without an organisation (the hub's oldest models): its cached snapshot, or None if not cached.

    Args:
        name: the bare name.

    Returns:
        The snapshot folder, or None when the cache has no ``models--NAME``.

    Raises:
        ModelError: the cache has the model but no usable snapshot.
    """
    if not _HUB_PART.fullmatch(name) or not (_hub_cache() / f"models--{name}").is_dir():
        return None
    return _cached_snapshot(name)


def _checked_model_folder(folder: Path) -> Path:
    if not (folder / "config.json").is_file():
        raise ModelError(f"{folder} has no config.json: {LAYOUT}")
    return folder


def _is_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(_HUB_PART.fullmatch(part) for part in parts)


def _hub_cache() -> Path:
    """The hub cache folder, chosen by the same environment variables as the ``hf`` tool."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):  # the second is the older name
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache_home = Path(os.environ["XDG_CACHE_HOME"]) if os.environ.get("XDG_CACHE_HOME") else Path("~/.cache")
    return cache_home.expanduser() / "huggingface" / "hub"


def _cached_snapshot(hub_id: str) -> Path:
    cache = _hub_cache()
    repo_name = "models--" + hub_id.replace("/", "--")
    repo = cache / repo_name
    fetch = f"selfattn never downloads: fetch it once with `hf download {hub_id}` or give a local folder"
    if not repo.is_dir():
        raise ModelError(
            f"model {hub_id!r} is not a folder here and not in the Hugging Face cache at {cache} "
            f"(looked for {repo_name}); {fetch}"
        )
    where = f"model {hub_id!r} in the Hugging Face cache at {repo}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
        snapshot = snapshots / commit
        # A hash is one folder name; anything else would point outside snapshots/.
        if not commit or Path(commit).name != commit or not snapshot.is_dir():
            raise ModelError(f"{where}: refs/main names snapshot {commit!r}, which is not in snapshots/; {fetch}")
    else:
        found = sorted(p for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []
        complete = [p for p in found if (p / "config.json").is_file()]
        if not found:
            raise ModelError(f"{where} has no snapshots; {fetch}")
        # Without refs/main, the newest complete snapshot is the best guess at "main".
        snapshot = found[0] if len(found) == 1 else max(complete or found, key=lambda p: p.stat().st_mtime)
    if not (snapshot / "config.json").is_file():
        raise ModelError(f"{where}: snapshot {snapshot.name} has no config.json; {fetch}")
    return snapshot


def locate(name_or_path, decoder: bool = False) -> Path:
    """The folder of a model that is not built in: a folder, or a hub id's snapshot in the cache.

    Args:
        name_or_path: a folder or a hub id.
        decoder: the model must generate: an unknown name's message lists decoders only.

    Raises:
        ModelError: a plain name (no "/") that is neither built in, a folder here, nor a
            hub id without an organisation in the cache is an unknown model (the message
            says what may be given); otherwise as ``find_model_folder``.
    """
    if isinstance(name_or_path, str) and "/" not in name_or_path and not Path(name_or_path).expanduser().exists():
        cached = find_cached(name_or_path.strip())  # the hub's oldest ids have no organisation
        if cached is not None:
            return cached
        built_in = [name for name, spec in MODELS.items() if not decoder or spec.kind == "decoder"]
        raise ModelError(f"unknown model {name_or_path!r}{did_you_mean(name_or_path, built_in)}: give {models_to_give(decoder)}")
    return find_model_folder(name_or_path)


def models_to_give(decoder: bool = False) -> str:
    """What a user may give as a model, for a message: the built-in ones, folders of each family, files, hub ids.

    Args:
        decoder: only what generates (the decoders: no encoder among them).

    Returns:
        The choices as one sentence part: "all-MiniLM-L6-v2, ... (built in), a folder ... or a hub id ...".
    """
    built_in = [name for name, spec in MODELS.items() if not decoder or spec.kind == "decoder"]
    families = decoder_family_names() if decoder else family_names()
    return (f"{'a decoder: ' if decoder else ''}{', '.join(built_in)} (built in), a folder in the Hugging Face layout "
            f"({', '.join(families)}), a GGUF file (.gguf) or ollama:NAME[:TAG] from ollama's store, a llama2.c "
            f"checkpoint file (.bin), or a hub id 'org/name' already in the local Hugging Face cache")


def model_name(name_or_path, folder: Path) -> str:
    """What outputs call the model: the hub id as given, else the folder's own name."""
    text = os.fspath(name_or_path)
    return text if not Path(text).expanduser().is_dir() else folder.resolve().name


def is_builtin(name: str) -> bool:
    """Whether ``name`` is a built-in model's name (any capitalisation, the hub's prefix allowed)."""
    return name in MODELS or name.strip().lower() in ALIASES


def model_key(name_or_path, decoder: bool = False) -> str:
    """What identifies a model: its canonical built-in name, or its folder's or file's full path.

    Args:
        name_or_path: a built-in name, a llama2.c checkpoint file, a folder or a hub id.
        decoder: the model must generate: an unknown name's message lists decoders only.

    Raises:
        ModelError: the name is neither a built-in model, a file, a folder with
            config.json, nor a hub id in the local cache (the message says where it looked).
    """
    if isinstance(name_or_path, str) and not Path(name_or_path).expanduser().is_dir() and is_builtin(name_or_path):
        return model_spec(name_or_path).name
    if is_ollama(name_or_path):
        return str(ollama_blob(name_or_path))  # the GGUF blob in ollama's store
    if isinstance(name_or_path, (str, os.PathLike)) and Path(name_or_path).expanduser().is_file():
        return str(Path(name_or_path).expanduser().resolve())  # a llama2.c checkpoint
    return str(locate(name_or_path, decoder).resolve())


def check_tokenizer_file(name_or_path, tokenizer) -> None:
    """A separate tokenizer file (--tokenizer) goes with a llama2.c checkpoint, and must be a file.

    Raises:
        ModelError: the model is a Hugging Face one (it has its own tokenizer.json), or the
            tokenizer is not a file.
    """
    name, single_file, gguf = _model_file(name_or_path)
    if gguf or not single_file:
        own = "the tokenizer inside its GGUF file" if gguf else "its own tokenizer.json"
        raise ModelError(f"a tokenizer file goes with a llama2.c checkpoint (a .bin file); {name} uses {own}")
    if not Path(tokenizer).expanduser().is_file():
        raise ModelError(f"the tokenizer {Path(tokenizer).expanduser()} is not a file")


def check_dtype_model(name_or_path) -> None:
    """--dtype chooses a GGUF model's weight type; other models keep the type they were saved in.

    Raises:
        ModelError: the model is not a GGUF file (nor a built-in one).
    """
    name, _, gguf = _model_file(name_or_path)
    if not gguf:
        raise ModelError(f"--dtype goes with a GGUF model (a .gguf file, ollama:NAME or SmolLM2-135M-Instruct); "
                         f"{name} keeps the type its weights were saved in")


def _model_file(name_or_path) -> tuple[str, bool, bool]:
    """What the checks of --tokenizer and --dtype read of a model, without loading it: (its name for
    messages, whether it is one file (a built-in's checkpoint, or a file here), whether it is a GGUF
    model: ollama:NAME, or a file named .gguf or starting with GGUF's bytes, which may not exist yet)."""
    text = os.fspath(name_or_path) if isinstance(name_or_path, (str, os.PathLike)) else ""
    if is_ollama(text):
        return text, True, True
    if isinstance(name_or_path, str) and not Path(text).expanduser().exists() and is_builtin(text):
        spec = model_spec(text)
        return spec.name, spec.checkpoint is not None, looks_like_gguf(spec.checkpoint or "")
    file = Path(text).expanduser()
    return text, file.is_file(), looks_like_gguf(file)


def read_json(path: Path):
    """The parsed JSON of ``path``; ModelError naming the file when it is unreadable or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ModelError(f"cannot read {path}: {first_sentence(str(error))}") from None


def first_sentence(text: str) -> str:
    """An error's first sentence on one line: readers' messages run over several lines."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # torch colours parts of its messages
    line = " ".join(text.split())
    return line.split(". ", 1)[0].rstrip(".") or "unreadable"
