"""Finding a model's folder (a local folder or the Hugging Face cache) and reading its weights.

The cache folders are built by hand in tmp_path in the layout the ``hf`` tool writes
(``models--org--name/refs/main`` and ``snapshots/<hash>/``), and one test asks
huggingface_hub itself to read that layout back. Weights are written by their own
writers (transformers' ``save_pretrained``, ``safetensors``, ``torch.save``) and compared
with the tensors written, never with our reader's earlier output.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from selfattn.errors import ModelError
from selfattn.models.checkpoint import read_weights
from selfattn.models.locate import find_model_folder, read_config

HASH = "0123456789abcdef0123456789abcdef01234567"
CACHE_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """No cache variable set and HOME in tmp_path, so the real cache is never seen."""
    for variable in CACHE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return monkeypatch


def cached_model(cache: Path, hub_id: str = "org/name", commit: str = HASH, ref: bool = True) -> Path:
    """A snapshot in ``cache`` laid out as ``hf download`` leaves it; returns the snapshot folder."""
    repo = cache / ("models--" + hub_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "gpt2", "commit": commit}))
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
    return snapshot


def tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(5, 3, generator=generator),
        "layer.0.bias": torch.randn(3, generator=generator, dtype=torch.float64),
        "layer.0.count": torch.arange(4, dtype=torch.int64),
    }


def assert_same_tensors(read: dict, written: dict) -> None:
    assert sorted(read) == sorted(written)
    for name, tensor in written.items():
        assert read[name].dtype == tensor.dtype, name
        assert torch.equal(read[name], tensor), name


# --- finding the folder ---------------------------------------------------------------


def test_local_folder_is_used_as_given_with_tilde_expanded(clean_env, tmp_path):
    folder = tmp_path / "home" / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert find_model_folder(folder) == folder
    assert find_model_folder("~/my-model") == folder


@pytest.mark.parametrize(
    "env, cache",
    [
        ({"HF_HUB_CACHE": "hubcache", "HF_HOME": "hfhome", "XDG_CACHE_HOME": "xdg"}, "hubcache"),
        ({"HF_HOME": "hfhome", "XDG_CACHE_HOME": "xdg"}, "hfhome/hub"),
        ({"XDG_CACHE_HOME": "xdg"}, "xdg/huggingface/hub"),
        ({}, "home/.cache/huggingface/hub"),
    ],
    ids=["HF_HUB_CACHE-first", "HF_HOME-before-XDG", "XDG_CACHE_HOME", "HOME-default"],
)
def test_hub_id_is_found_in_the_cache_the_variables_choose(clean_env, tmp_path, env, cache):
    for variable, value in env.items():
        clean_env.setenv(variable, str(tmp_path / value))
    # A decoy in every other candidate cache: only the chosen one may be read.
    for other in {"hubcache", "hfhome/hub", "xdg/huggingface/hub", "home/.cache/huggingface/hub"} - {cache}:
        cached_model(tmp_path / other, commit="f" * 40)
    snapshot = cached_model(tmp_path / cache)
    assert find_model_folder("org/name") == snapshot
    assert read_config(find_model_folder("org/name"))["commit"] == HASH


def test_the_layout_we_build_is_the_one_huggingface_hub_reads(clean_env, tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    snapshot = cached_model(tmp_path / "cache")
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    theirs = hub.try_to_load_from_cache("org/name", "config.json", cache_dir=tmp_path / "cache")
    assert Path(theirs) == find_model_folder("org/name") / "config.json" == snapshot / "config.json"


def test_refs_main_wins_over_a_newer_snapshot(clean_env, tmp_path):
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path))
    main = cached_model(tmp_path)
    newer = cached_model(tmp_path, commit="e" * 40, ref=False)
    os.utime(main, (1_000_000, 1_000_000))
    assert newer.stat().st_mtime > main.stat().st_mtime
    assert find_model_folder("org/name") == main


def test_without_refs_main_the_only_snapshot_is_used(clean_env, tmp_path):
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path))
    snapshot = cached_model(tmp_path, ref=False)
    assert find_model_folder("org/name") == snapshot


def test_without_refs_main_the_newest_snapshot_with_config_is_used(clean_env, tmp_path):
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path))
    old = cached_model(tmp_path, commit="a" * 40, ref=False)
    middle = cached_model(tmp_path, commit="b" * 40, ref=False)
    newest_incomplete = tmp_path / "models--org--name" / "snapshots" / ("c" * 40)
    newest_incomplete.mkdir()
    os.utime(old, (1_000_000, 1_000_000))
    os.utime(middle, (2_000_000, 2_000_000))
    os.utime(newest_incomplete, (3_000_000, 3_000_000))
    assert find_model_folder("org/name") == middle


def test_a_hub_id_not_in_the_cache_names_the_cache_and_never_downloads(clean_env, tmp_path):
    clean_env.setenv("HF_HOME", str(tmp_path / "hfhome"))
    with pytest.raises(ModelError) as caught:
        find_model_folder("org/name")
    message = str(caught.value)
    assert str(tmp_path / "hfhome" / "hub") in message
    assert "models--org--name" in message
    assert "hf download org/name" in message
    assert "\n" not in message


def test_refs_main_naming_a_missing_snapshot_is_an_error(clean_env, tmp_path):
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path))
    cached_model(tmp_path)
    (tmp_path / "models--org--name" / "refs" / "main").write_text("d" * 40)
    with pytest.raises(ModelError, match="refs/main names snapshot 'd{40}'"):
        find_model_folder("org/name")


def test_a_cached_snapshot_without_config_is_an_error(clean_env, tmp_path):
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path))
    (cached_model(tmp_path) / "config.json").unlink()
    with pytest.raises(ModelError, match=f"snapshot {HASH} has no config.json"):
        find_model_folder("org/name")


def test_a_folder_without_config_says_what_a_model_folder_holds(tmp_path):
    with pytest.raises(ModelError) as caught:
        find_model_folder(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path} has no config.json: a model folder in the Hugging Face layout")
    assert "tokenizer.json" in str(caught.value)


def test_a_path_that_is_a_file_says_so(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with pytest.raises(ModelError, match="is a file, not a folder"):
        find_model_folder(str(file))


@pytest.mark.parametrize("name", ["./missing", "/no/such/folder", "just-a-name", "a/b/c", "org/.hidden", "org/na--me"])
def test_a_missing_path_that_is_no_hub_id_is_not_looked_up(clean_env, tmp_path, name):
    clean_env.chdir(tmp_path)
    with pytest.raises(ModelError, match="is not a folder here .* not a hub id"):
        find_model_folder(name)


@pytest.mark.parametrize("value", [None, 3, b"org/name", ["org/name"], "", "   "])
def test_a_non_string_or_empty_name_is_a_model_error(value):
    with pytest.raises(ModelError, match="must be a folder or a hub id"):
        find_model_folder(value)


# --- config -----------------------------------------------------------------------------


@pytest.mark.parametrize("text, match", [("[1, 2]", "holds a JSON list"), ("{not json", "cannot read"), (None, "cannot read")])
def test_a_bad_config_names_the_file(tmp_path, text, match):
    if text is not None:
        (tmp_path / "config.json").write_text(text)
    with pytest.raises(ModelError, match=match) as caught:
        read_config(tmp_path)
    assert str(tmp_path / "config.json") in str(caught.value)


# --- weights ----------------------------------------------------------------------------


def test_sharded_safetensors_from_save_pretrained_read_back_exactly(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) >= 3 and (tmp_path / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "model.safetensors").exists()

    read = read_weights(tmp_path)
    state = model.state_dict()
    # transformers leaves out the LM head, tied to the token embedding; all else is saved.
    assert set(state) - set(read) == {"lm_head.weight"}
    assert_same_tensors(read, {name: state[name] for name in read})
    on_disk = {name: tensor for shard in shards for name, tensor in load_file(shard).items()}
    assert_same_tensors(read, on_disk)


def test_a_single_safetensors_file(tmp_path):
    save_file(tensors(), tmp_path / "model.safetensors")
    torch.save({"ignored": torch.zeros(1)}, tmp_path / "pytorch_model.bin")  # safetensors comes first
    assert_same_tensors(read_weights(tmp_path), tensors())


def test_a_pytorch_bin_state_dict(tmp_path):
    torch.save(tensors(), tmp_path / "pytorch_model.bin")
    assert_same_tensors(read_weights(tmp_path), tensors())


def write_index(folder: Path, weight_map: dict, name: str = "model.safetensors.index.json") -> None:
    (folder / name).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


def test_sharded_pytorch_bin(tmp_path):
    written = tensors()
    names = sorted(written)
    torch.save({n: written[n] for n in names[:2]}, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save({n: written[n] for n in names[2:]}, tmp_path / "pytorch_model-00002-of-00002.bin")
    weight_map = {n: f"pytorch_model-0000{1 if i < 2 else 2}-of-00002.bin" for i, n in enumerate(names)}
    write_index(tmp_path, weight_map, "pytorch_model.bin.index.json")
    assert_same_tensors(read_weights(tmp_path), written)


def test_a_pickle_weights_only_refuses_is_a_one_line_model_error(tmp_path):
    torch.save({"when": datetime.datetime(2024, 1, 1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelError) as caught:
        read_weights(tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "pytorch_model.bin") in message
    assert "weights_only=True" in message and "datetime.datetime" in message
    assert "\n" not in message and "\x1b" not in message


def test_a_pickle_of_non_tensors_is_a_model_error(tmp_path):
    torch.save({"step": 3}, tmp_path / "pytorch_model.bin")  # weights_only allows ints
    with pytest.raises(ModelError, match="holds 'step': int, not a tensor"):
        read_weights(tmp_path)


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_a_corrupt_file_names_the_file_on_one_line(tmp_path, name):
    (tmp_path / name).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    with pytest.raises(ModelError, match=f"cannot read {tmp_path / name}: ") as caught:
        read_weights(tmp_path)
    assert "\n" not in str(caught.value)


def test_an_index_naming_a_missing_shard_names_it(tmp_path):
    save_file({"a": torch.ones(2)}, tmp_path / "model-00001-of-00002.safetensors")
    write_index(tmp_path, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    with pytest.raises(ModelError, match="shards that are not in .*: model-00002-of-00002.safetensors$"):
        read_weights(tmp_path)


def test_an_index_listing_a_tensor_its_shard_lacks(tmp_path):
    save_file({"a": torch.ones(2)}, tmp_path / "shard.safetensors")
    write_index(tmp_path, {"a": "shard.safetensors", "b": "shard.safetensors"})
    with pytest.raises(ModelError, match="shard.safetensors lacks b"):
        read_weights(tmp_path)


def test_a_tensor_stored_in_two_shards(tmp_path):
    save_file({"a": torch.ones(2)}, tmp_path / "one.safetensors")
    save_file({"a": torch.ones(2), "b": torch.zeros(1)}, tmp_path / "two.safetensors")
    write_index(tmp_path, {"a": "one.safetensors", "b": "two.safetensors"})
    with pytest.raises(ModelError, match="'a' is stored twice, in one.safetensors and two.safetensors"):
        read_weights(tmp_path)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/abs/shard.safetensors", 7])
def test_an_index_pointing_outside_the_folder(tmp_path, shard):
    write_index(tmp_path, {"a": shard})
    with pytest.raises(ModelError, match="not a file name in"):
        read_weights(tmp_path)


def test_no_weights_lists_what_was_looked_for(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError) as caught:
        read_weights(tmp_path)
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"):
        assert name in str(caught.value)
