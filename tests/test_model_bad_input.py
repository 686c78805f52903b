"""Checkpoints and prompts that do not fit: one clear error naming the problem, nothing loaded or changed."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tiny_models import tiny_checkpoint

from selfattn.models.registry import family_names

pytest.importorskip("transformers")

import selfattn as sa  # noqa: E402


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return tiny_checkpoint("llama", tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def llama(llama_folder):
    return sa.load_pretrained(llama_folder)


def _copy(folder, target, config_change=None, weights_change=None):
    target.mkdir()
    for item in folder.iterdir():
        target.joinpath(item.name).write_bytes(item.read_bytes())
    if config_change:
        config = json.loads((target / "config.json").read_text())
        config_change(config)
        (target / "config.json").write_text(json.dumps(config))
    if weights_change:
        state = load_file(target / "model.safetensors")
        weights_change(state)
        save_file(state, target / "model.safetensors")
    return target


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c.update(model_type="gpt_neox"), r"model_type 'gpt_neox'.*" + ", ".join(family_names())),
        (lambda c: c["rope_parameters"].update(rope_type="yarn"), r"'rope_parameters'.*'yarn'"),
        (lambda c: c.update(num_local_experts=8), r"'num_local_experts'.*mixture of experts"),
        (lambda c: c.update(partial_rotary_factor=0.5), r"'partial_rotary_factor'"),
        (lambda c: c.update(hidden_act="gelu"), r"'hidden_act'"),
        (lambda c: c.pop("hidden_size"), r"'hidden_size'"),
        (lambda c: c.update(num_key_value_heads=3), r"num_key_value_heads"),
    ],
)
def test_a_config_we_do_not_compute_is_refused_by_field(llama_folder, tmp_path, change, message):
    folder = _copy(llama_folder, tmp_path / "m", config_change=change)
    with pytest.raises(sa.ModelError, match=message):
        sa.load_pretrained(folder)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.pop("model.layers.1.mlp.up_proj.weight"), r"lacks model\.layers\.1\.mlp\.up_proj\.weight"),
        (lambda s: s.update({"model.layers.0.extra.weight": torch.zeros(2)}), r"uses: model\.layers\.0\.extra\.weight"),
        (
            lambda s: s.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(8, 64)}),
            r"model\.layers\.0\.self_attn\.k_proj\.weight has shape \(8, 64\).*\(32, 64\)",
        ),
    ],
)
def test_missing_extra_and_misshaped_tensors_are_named(llama_folder, tmp_path, change, message):
    folder = _copy(llama_folder, tmp_path / "m", weights_change=change)
    with pytest.raises(sa.ModelError, match=message):
        sa.load_pretrained(folder)


def test_a_folder_without_config_or_tokenizer(llama_folder, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(sa.ModelError, match="no config.json"):
        sa.load_pretrained(tmp_path / "empty")
    folder = _copy(llama_folder, tmp_path / "m")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(sa.ModelError, match="no tokenizer.json"):
        sa.load_pretrained(folder)


def test_a_hub_id_that_is_not_in_the_cache_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(sa.ModelError, match=r"models--meta-llama--Llama-3\.2-1B") as caught:
        sa.load_pretrained("meta-llama/Llama-3.2-1B")
    assert str(tmp_path / "cache") in str(caught.value) and "\n" not in str(caught.value)


def test_prompts_and_generation_options_out_of_range(llama):
    limit = llama.config.max_positions
    with pytest.raises(sa.SentenceError, match=f"{limit} positions"):
        llama(list(range(5, 5 + limit + 1)))
    past = llama.generate("The cat", max_new_tokens=limit)  # past the positions the window slides
    assert len(past.ids[0]) == limit or past.ids[0][-1] in llama.config.eos_ids
    with pytest.raises(sa.OptionError, match="from 1 to 10000"):
        llama.generate("The cat", max_new_tokens=10_001)
    for options, name in [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=2.5), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(seed=-3), "seed"),
    ]:
        with pytest.raises(sa.OptionError, match=name):
            llama.generate("The cat", **options)
    for bad in ([], [[]], [10**6], ["a", 3], torch.zeros(2, 3)):
        with pytest.raises(sa.SentenceError):
            llama(bad)
