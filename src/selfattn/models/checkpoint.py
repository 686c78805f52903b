"""A model's weights, read from its folder without running pickled code, never the network.

Safetensors first (one file, or shards with an index), else ``pytorch_model.bin`` through
``torch.load(weights_only=True)``. ``locate`` finds the folder and reads its config.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from selfattn.errors import ModelError
from selfattn.models.locate import first_sentence, read_json

# Weight files in the order we prefer them: the first one present is read.
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLE, PICKLE_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, PICKLE, PICKLE_INDEX)


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


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path, device="cpu")
    except Exception as error:  # noqa: BLE001 -- the file is the user's: any failure to parse it is theirs to fix
        raise ModelError(f"cannot read {path}: {first_sentence(str(error))}") from None


def _read_pickle(path: Path) -> dict[str, torch.Tensor]:
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 -- as above; weights_only refusals are UnpicklingError
        text = str(error)
        if "WeightsUnpickler error:" in text:
            reason = first_sentence(text.split("WeightsUnpickler error:", 1)[1])
            raise ModelError(
                f"cannot read {path}: torch.load(weights_only=True) refused it ({reason}); "
                "selfattn never runs pickled code: save the weights as safetensors"
            ) from None
        raise ModelError(f"cannot read {path}: {first_sentence(text)}") from None
    if not isinstance(loaded, dict):
        raise ModelError(f"{path} holds a {type(loaded).__name__}, not a dict of tensor name -> tensor")
    for key, value in loaded.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ModelError(f"{path} holds {key!r}: {type(value).__name__}, not a tensor under a string name")
    return loaded


def _read_sharded(index_path: Path, read_shard: Callable[[Path], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The tensors of every shard an index lists, checked against the index's weight_map."""
    index = read_json(index_path)
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


