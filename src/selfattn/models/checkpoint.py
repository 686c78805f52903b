"""Where a user's model lives on disk, and how its config and weights are read, never the network.

The rules, in order:

- A model is a folder in the Hugging Face layout: ``config.json``, the weights and
  usually ``tokenizer.json``. A path to such a folder is used as it is.
- A hub id ``org/name`` that is not a folder here is looked up in the local Hugging Face
  cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``${XDG_CACHE_HOME:-~/.cache}/huggingface/hub``): ``models--org--name/refs/main`` names
  the snapshot whose files we read. Nothing is ever downloaded; the error says how to
  fetch the model once.
- Weights are read without running pickled code: safetensors first (one file or shards
  with an index), else ``pytorch_model.bin`` through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from selfattn.errors import ModelError

LAYOUT = "a model folder in the Hugging Face layout holds config.json, the weights (model.safetensors ...) and tokenizer.json"

# Weight files in the order we prefer them: the first one present is read.
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLE, PICKLE_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, PICKLE, PICKLE_INDEX)

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
    config = _read_json(path)
    if not isinstance(config, dict):
        raise ModelError(f"{path} holds a JSON {type(config).__name__}, not an object of settings")
    return config


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the model's checkpoint, on the CPU, read without running pickled code.

    The first of these present is read: ``model.safetensors``;
    ``model.safetensors.index.json`` with the shards its ``weight_map`` names;
    ``pytorch_model.bin``; ``pytorch_model.bin.index.json`` with its shards. The ``.bin``
    files go through ``torch.load(weights_only=True)``, which refuses arbitrary objects.

    Args:
        folder: the model folder, as ``find_model_folder`` gives it.

    Returns:
        Tensor name -> tensor, exactly the names stored in the checkpoint.

    Raises:
        ModelError: there is no weights file, a file is unreadable or corrupt, a pickle
            holds something other than tensors, a shard is missing, or the shards
            disagree with their index (a listed tensor absent, a tensor stored twice).
    """
    folder = Path(folder)
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        if name == SAFETENSORS:
            return _read_safetensors(path)
        if name == PICKLE:
            return _read_pickle(path)
        return _read_sharded(path, _read_safetensors if name == SAFETENSORS_INDEX else _read_pickle)
    raise ModelError(f"{folder} has no weights: looked for {', '.join(WEIGHT_FILES)}")


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


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ModelError(f"cannot read {path}: {_first_sentence(str(error))}") from None


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path, device="cpu")
    except Exception as error:  # noqa: BLE001 -- the file is the user's: any failure to parse it is theirs to fix
        raise ModelError(f"cannot read {path}: {_first_sentence(str(error))}") from None


def _read_pickle(path: Path) -> dict[str, torch.Tensor]:
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 -- as above; weights_only refusals are UnpicklingError
        text = str(error)
        if "WeightsUnpickler error:" in text:
            reason = _first_sentence(text.split("WeightsUnpickler error:", 1)[1])
            raise ModelError(
                f"cannot read {path}: torch.load(weights_only=True) refused it ({reason}); "
                "selfattn never runs pickled code: save the weights as safetensors"
            ) from None
        raise ModelError(f"cannot read {path}: {_first_sentence(text)}") from None
    if not isinstance(loaded, dict):
        raise ModelError(f"{path} holds a {type(loaded).__name__}, not a dict of tensor name -> tensor")
    for key, value in loaded.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ModelError(f"{path} holds {key!r}: {type(value).__name__}, not a tensor under a string name")
    return loaded


def _read_sharded(index_path: Path, read_shard: Callable[[Path], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The tensors of every shard an index lists, checked against the index's weight_map."""
    index = _read_json(index_path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelError(f"{index_path} has no weight_map (tensor name -> shard file)")
    by_shard: dict[str, list[str]] = {}
    for tensor_name, shard in weight_map.items():
        # Shards sit beside the index; a path that leaves the folder is not a shard.
        if not isinstance(shard, str) or not shard or Path(shard).name != shard:
            raise ModelError(f"{index_path} maps {tensor_name!r} to {shard!r}, not a file name in {index_path.parent}")
        by_shard.setdefault(shard, []).append(tensor_name)
    missing = [shard for shard in by_shard if not (index_path.parent / shard).is_file()]
    if missing:
        raise ModelError(f"{index_path} lists shards that are not in {index_path.parent}: {', '.join(missing)}")
    tensors: dict[str, torch.Tensor] = {}
    stored_in: dict[str, str] = {}
    for shard, listed in by_shard.items():
        content = read_shard(index_path.parent / shard)
        absent = [name for name in listed if name not in content]
        if absent:
            shown = ", ".join(absent[:3]) + (" ..." if len(absent) > 3 else "")
            raise ModelError(f"{shard} lacks {shown}, which {index_path.name} puts there")
        for name, tensor in content.items():
            if name in stored_in:
                raise ModelError(f"tensor {name!r} is stored twice, in {stored_in[name]} and {shard}")
            if name not in weight_map:
                raise ModelError(f"{shard} holds {name!r}, which {index_path.name} does not list")
            stored_in[name] = shard
            tensors[name] = tensor
    return tensors


def _first_sentence(text: str) -> str:
    """An error's first sentence on one line: readers' messages run over several lines."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # torch colours parts of its messages
    line = " ".join(text.split())
    return line.split(". ", 1)[0].rstrip(".") or "unreadable"
