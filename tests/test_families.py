"""The registry of model families: one file per family, found without a list, named only there.

The records are checked against the families' published layouts (the tensor names a
transformers checkpoint of each holds, which configs they refuse), the registry's names
against its folder, and the source against the rule that a family's name is written only
in its own file.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import selfattn as sa
from selfattn.models import FAMILIES
from selfattn.models.decoder import DecoderModel
from selfattn.models.encoder import BertModel
from selfattn.models.family import Family
from selfattn.models.registry import decoder_names, family_names, family_of, one_of
from selfattn.models.weights import copy_weights, export_weights

SRC = Path(__file__).resolve().parents[1] / "src" / "selfattn"

# Tiny but complete config.json files, with the fields a transformers checkpoint writes.
_LLAMA_SHAPED = {
    "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 2,
    "intermediate_size": 16, "max_position_embeddings": 32, "vocab_size": 10, "rms_norm_eps": 1e-6, "eos_token_id": 2,
}
CONFIGS = {
    "bert": {
        "model_type": "bert", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 16, "max_position_embeddings": 16, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
    },
    "gpt2": {"model_type": "gpt2", "n_embd": 8, "n_head": 2, "n_layer": 2, "n_positions": 16, "vocab_size": 10},
    "llama": dict(_LLAMA_SHAPED, model_type="llama"),
    "mistral": dict(_LLAMA_SHAPED, model_type="mistral", sliding_window=4),
    "qwen2": dict(_LLAMA_SHAPED, model_type="qwen2", sliding_window=4, use_sliding_window=True, max_window_layers=1),
    "qwen3": dict(_LLAMA_SHAPED, model_type="qwen3", head_dim=6, sliding_window=None, layer_types=["full_attention"] * 2),
    "gemma3_text": dict(
        _LLAMA_SHAPED, model_type="gemma3_text", head_dim=6, query_pre_attn_scalar=9, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], hidden_activation="gelu_pytorch_tanh",
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        attn_logit_softcapping=None, final_logit_softcapping=None, tie_word_embeddings=True,
    ),
}
# (kind, a tensor of a transformers checkpoint's names, a name it holds that we ignore);
# GPT2LMHeadModel's names start with "transformer.", which its wte tensor tells apart.
LAYOUTS = {
    "bert": ("encoder", "encoder.layer.1.attention.self.query.weight", "pooler.dense.weight"),
    "gpt2": ("decoder", "transformer.h.1.attn.c_attn.weight", "transformer.h.0.attn.masked_bias"),
    "llama": ("decoder", "model.layers.1.self_attn.q_proj.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"),
    "mistral": ("decoder", "model.layers.1.mlp.gate_proj.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"),
    "qwen2": ("decoder", "model.layers.1.self_attn.k_proj.bias", "model.layers.0.self_attn.rotary_emb.inv_freq"),
    "qwen3": ("decoder", "model.layers.1.self_attn.k_norm.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"),
    "gemma3_text": ("decoder", "model.layers.1.pre_feedforward_layernorm.weight", "lm_head.weight"),
}


def build(name: str):
    """A randomly initialised model of the family's tiny config, and that config."""
    config = FAMILIES[name].read_config(CONFIGS[name])
    return (BertModel if FAMILIES[name].kind == "encoder" else DecoderModel)(config), config


def test_the_registry_holds_the_families_named_by_their_files():
    assert set(LAYOUTS) <= set(FAMILIES)
    assert family_names() == tuple(sorted(FAMILIES)) == tuple(FAMILIES)
    assert ", ".join(FAMILIES) == "bert, gemma3_text, gpt2, llama, mistral, qwen2, qwen3"
    assert "llama" in FAMILIES and "gpt_neox" not in FAMILIES
    for name, family in FAMILIES.items():
        assert isinstance(family, Family) and family.model_type == name
        assert family.description and "\n" not in family.description
    assert decoder_names() == ("gemma3_text", "gpt2", "llama", "mistral", "qwen2", "qwen3")


def test_listing_the_families_imports_no_torch():
    code = (
        "import json, sys\n"
        "from selfattn.models.registry import family_names\n"
        "import selfattn.models, selfattn.models.families\n"
        "print(json.dumps([family_names(), 'torch' in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, torch_loaded = json.loads(done.stdout)
    assert tuple(names) == tuple(sorted(FAMILIES))
    assert torch_loaded is False


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_family_reads_its_config_and_maps_its_checkpoint(name):
    kind, tensor, unused = LAYOUTS[name]
    family = FAMILIES[name]
    assert family.kind == kind
    model, config = build(name)
    assert config.model_type == name
    rules, ignored = family.weight_table(config, [tensor, unused, "transformer.wte.weight"])
    sources = {r.source for r in rules}
    assert tensor in sources
    assert ignored(unused) and not ignored(tensor)
    # Every parameter is filled exactly once by the table (copy_weights asserts it), and a
    # checkpoint written by the table is accepted whole by a fresh model.
    state = export_weights(model, rules)
    fresh, _ = build(name)
    copy_weights(fresh, state, rules, ignored, name)
    for key, value in fresh.state_dict().items():
        torch.testing.assert_close(value, model.state_dict()[key], rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_refused_field_is_refused_by_name(name):
    family = FAMILIES[name]
    expected = {"bert": set(), "gpt2": {"add_cross_attention", "scale_attn_by_inverse_layer_idx"}}
    if name in expected:
        assert set(family.refused) == expected[name]
    else:  # Llama-shaped: other models' experts and sinks
        assert {"num_local_experts", "num_experts", "attention_sinks"} <= set(family.refused)
    for field in family.refused:
        with pytest.raises(sa.ModelError, match=f"'{field}'"):
            family.read_config(dict(CONFIGS[name], **{field: True}))


def test_the_llama_shaped_families_differ_only_in_their_data():
    read = {name: FAMILIES[name].read_config for name in ("llama", "mistral", "qwen2")}
    llama = read["llama"](dict(CONFIGS["llama"], sliding_window=4, attention_bias=True, mlp_bias=True))
    assert (llama.sliding_windows, llama.attention_bias, llama.out_bias, llama.bias) == ((), True, True, True)
    mistral = read["mistral"](dict(CONFIGS["mistral"], mlp_bias=True))
    assert (mistral.sliding_windows, mistral.attention_bias, mistral.out_bias, mistral.bias) == ((4, 4), False, False, False)
    assert read["mistral"](dict(CONFIGS["mistral"], sliding_window=None)).sliding_windows == ()
    qwen2 = read["qwen2"](dict(CONFIGS["qwen2"], attention_bias=False))
    assert (qwen2.sliding_windows, qwen2.attention_bias, qwen2.out_bias, qwen2.bias) == ((None, 4), True, False, False)
    typed = read["qwen2"](dict(CONFIGS["qwen2"], layer_types=["sliding_attention", "full_attention"]))
    assert typed.sliding_windows == (4, None)
    assert read["qwen2"](dict(CONFIGS["qwen2"], use_sliding_window=False)).sliding_windows == ()
    with pytest.raises(sa.ModelError, match="'layer_types'"):
        read["qwen2"](dict(CONFIGS["qwen2"], layer_types=["sliding_attention"]))


def test_qwen3_is_the_llama_layout_with_head_norms():
    read = FAMILIES["qwen3"].read_config
    qwen3 = read(CONFIGS["qwen3"])
    assert (qwen3.qk_norm, qwen3.d_head, qwen3.attention_bias, qwen3.out_bias, qwen3.sliding_windows) == (True, 6, False, False, ())
    assert (qwen3.activation, qwen3.norm_gain, qwen3.sandwich_norm, qwen3.scale, qwen3.scale_embeddings) == (
        "swiglu", "w", False, None, False)
    biased = read(dict(CONFIGS["qwen3"], attention_bias=True))
    assert (biased.attention_bias, biased.out_bias) == (True, True)
    windowed = read(dict(CONFIGS["qwen3"], sliding_window=4, use_sliding_window=True, max_window_layers=1, layer_types=None))
    assert windowed.sliding_windows == (None, 4)
    for field in ("num_experts", "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers"):
        with pytest.raises(sa.ModelError, match=f"^config.json field '{field}' asks for a mixture of experts"):
            read(dict(CONFIGS["qwen3"], **{field: [1] if field == "mlp_only_layers" else 8}))


def test_gemma3_reads_its_layer_kinds_bases_scale_and_norms():
    read = FAMILIES["gemma3_text"].read_config
    gemma = read(CONFIGS["gemma3_text"])
    assert gemma.sliding_windows == (4, None) and gemma.rope_bases == (10000.0, 1000000.0) and gemma.rope_base == 1e6
    assert gemma.scale == pytest.approx(1 / 3) and gemma.d_head == 6 and gemma.tie_embeddings
    assert (gemma.activation, gemma.norm_gain, gemma.sandwich_norm, gemma.scale_embeddings, gemma.qk_norm) == (
        "geglu_tanh", "1+w", True, True, True)
    blocks = [gemma.block(i) for i in range(2)]
    assert [b.rope_base for b in blocks] == [10000.0, 1000000.0] and [b.sliding_window for b in blocks] == [4, None]
    # Older configs: a base field per kind of layer and a pattern of sliding layers.
    older = {k: v for k, v in CONFIGS["gemma3_text"].items() if k not in ("rope_parameters", "layer_types")}
    old = read(dict(older, rope_theta=500000.0, rope_local_base_freq=50.0, rope_scaling=None, sliding_window_pattern=2))
    assert old.sliding_windows == (4, None) and old.rope_bases == (50.0, 500000.0)
    assert read(dict(older, num_hidden_layers=7)).sliding_windows == (4,) * 5 + (None, 4)  # the default pattern: every 6th is full


@pytest.mark.parametrize(("change", "field"), [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"num_experts": 4}, "num_experts"),
    ({"hidden_activation": "silu"}, "hidden_activation"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                          "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}, "rope_parameters"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters"),
    ({"rope_parameters": None, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "rope_scaling"),
    ({"rope_parameters": None, "rope_local_base_freq": 1.0}, "rope_local_base_freq"),
    ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
    ({"layer_types": ["sliding_attention", "global"]}, "layer_types"),
    ({"sliding_window": None}, "sliding_window"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_gemma3_refuses_what_it_does_not_compute_naming_the_field(change, field):
    with pytest.raises(sa.ModelError, match=f"^config.json[^\n]*'{field}'[^\n]*$"):
        FAMILIES["gemma3_text"].read_config(dict(CONFIGS["gemma3_text"], **change))


def test_an_unknown_model_type_is_refused_with_the_registrys_names(tmp_path, monkeypatch):
    for model_type in ("gpt_neox", ["gpt2"]):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        with pytest.raises(sa.ModelError, match=re.escape(f"{model_type!r}: selfattn loads {', '.join(FAMILIES)}")):
            sa.load_pretrained(folder)
    # The message is read from the registry: a family registered for this test is listed.
    monkeypatch.setitem(FAMILIES, "zz_test", FAMILIES["gpt2"])
    with pytest.raises(sa.ModelError, match="selfattn loads bert, gemma3_text, gpt2, llama, mistral, qwen2, qwen3, zz_test$"):
        sa.load_pretrained(folder)


def test_an_encoder_refuses_to_generate_naming_the_decoders():
    model, _ = build("bert")
    assert model.name == "bert"
    with pytest.raises(sa.ModelError, match=re.escape(f"generate takes a decoder ({one_of(decoder_names())})") + "$"):
        model.generate("The cat")
    assert one_of(decoder_names()) == "gemma3_text, gpt2, llama, mistral, qwen2 or qwen3"


def test_a_malformed_family_record_or_file_is_refused():
    gpt2 = FAMILIES["gpt2"]
    fields = {"model_type": "x", "kind": "decoder", "description": "d", "read_config": dict, "weight_table": gpt2.weight_table}
    with pytest.raises(ValueError, match="kind"):
        Family(**dict(fields, kind="both"))
    with pytest.raises(ValueError, match="own load"):
        Family(**dict(fields, kind="encoder"))
    with pytest.raises(ValueError, match="module name"):
        Family(**dict(fields, model_type="not-a-name"))
    with pytest.raises(TypeError, match="FAMILY"):
        family_of(types.ModuleType("selfattn.models.families.nothing"), "nothing")
    renamed = types.ModuleType("selfattn.models.families.other")
    renamed.FAMILY = gpt2
    with pytest.raises(TypeError, match="'other'"):
        family_of(renamed, "other")


# --- a family's name is written only in its own file ----------------------------------


def names_written(source: str, names) -> set[tuple[str, int]]:
    """(family name, line) for each string constant (docstrings included) naming a family as a word
    (llama.cpp, the program, is not the family)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= {(name, node.lineno) for name in names if re.search(rf"\b{re.escape(name)}\b(?!\.cpp)", node.value)}
    return found


def test_the_name_check_sees_docstrings_and_strings_but_not_code():
    source = '"""About gpt2."""\nimport llama_layout\nx = f"{y} mistral"\nz = "qwen2x" + "llama3" + "llama.cpp"\n'
    assert names_written(source, family_names()) == {("gpt2", 1), ("mistral", 3)}


SOURCES = sorted(SRC.rglob("*.py"))
# Files whose strings share words with family names in another namespace: llama.cpp's tokenizer
# kinds (tokenizer.ggml.model "gpt2", "llama") and pre-tokenizer names ("qwen2", ...) in GGUF files.
OTHER_NAMESPACES = {"models/gguf_tokenizer.py": "llama.cpp's tokenizer kinds and pre-tokenizer names"}


@pytest.mark.parametrize("path", [p for p in SOURCES if str(p.relative_to(SRC)) not in OTHER_NAMESPACES],
                         ids=lambda p: str(p.relative_to(SRC)))
def test_a_family_name_is_written_only_in_its_own_file(path):
    own = path.stem if path.parent == SRC / "models" / "families" else None
    names = [name for name in family_names() if name != own]
    found = sorted(names_written(path.read_text(encoding="utf-8"), names))
    assert not found, f"{path.relative_to(SRC)} names other families: " + ", ".join(f"{n} (line {line})" for n, line in found)


def test_the_docs_list_of_families_is_the_registry():
    """docs/models.md's table of what is supported names every registered family, and only those."""
    page = (SRC.parents[1] / "docs" / "models.md").read_text(encoding="utf-8")
    table = page[page.index("| model_type |"):].split("\n\n")[0]
    listed = [re.match(r"\| `([^`]+)` \|", line).group(1) for line in table.splitlines()[2:]]
    assert sorted(listed) == list(family_names()) == list(FAMILIES)
