"""One config per level: a setting reaches the module that computes it by its own name.

A family's options go into ``DecoderConfig`` (a ``TransformerConfig`` plus the model's own
fields); ``DecoderConfig.block`` and ``TransformerConfig.attention`` hand every shared field
on by name. These tests set every shared field to a value that is not its default and
check that it arrives, so a field added to both levels and left behind fails here.
"""

from __future__ import annotations

import dataclasses

import pytest

from selfattn.attention.config import AttentionConfig, TransformerConfig
from selfattn.errors import ConfigError
from selfattn.models.decoder_config import DecoderConfig
from selfattn.models.llama_layout import LlamaShape
from selfattn.positional.rope_scaling import Llama3RopeScaling

SCALING = Llama3RopeScaling(8.0, 1.0, 4.0, 64)
# A value that is not the default, for every field a block and its attention share.
NOT_DEFAULT = dict(
    d_model=16, n_heads=4, n_kv_heads=2, d_head=6, dropout=0.1, positional="rope", rope_base=500.0,
    attn_impl="flash", rope_pairs="half", rope_scaling=SCALING, sliding_window=3, out_bias=False,
    flash_min_queries=7, scale=0.3, qk_norm=True, norm_eps=1e-3, norm_gain="1+w",
)


def names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_field_a_block_shares_with_its_attention_arrives_by_name():
    shared = names(AttentionConfig) & names(TransformerConfig)
    assert shared - {"bias"} == set(NOT_DEFAULT), "give the new shared field a value in NOT_DEFAULT"
    defaults = AttentionConfig(d_model=16, n_heads=4)
    block = TransformerConfig(norm="rms", bias=True, attention_bias=False, **NOT_DEFAULT)
    for name, value in NOT_DEFAULT.items():
        assert getattr(block.attention, name) == value, name
        assert name in ("d_model", "n_heads", "d_head") or getattr(defaults, name) != value, f"{name}: pick another value"
    assert block.attention.bias is False  # attention_bias wins over bias for W_q, W_k, W_v
    assert TransformerConfig(d_model=8, n_heads=2, bias=False).attention.bias is False


def decoder(**changes) -> DecoderConfig:
    fields = dict(model_type="llama", vocab_size=11, d_model=16, n_layers=3, n_heads=4, n_kv_heads=2, d_head=6,
                  d_ff=20, activation="swiglu", norm="rms", norm_eps=1e-3, positional="rope", max_positions=64)
    return DecoderConfig(**{**fields, **changes})


def test_a_decoder_hands_every_block_field_on_and_only_the_layers_own_differ():
    config = decoder(rope_scaling=SCALING, sliding_windows=(3, None, 5), rope_bases=(100.0, 200.0, 300.0), dropout=0.1,
                     attn_impl="flash", flash_min_queries=7, scale=0.3, qk_norm=True, norm_gain="1+w",
                     sandwich_norm=True, bias=True, attention_bias=True, out_bias=True, rope_pairs="interleaved")
    per_layer = {"rope_base", "sliding_window"}
    for layer, (window, base) in enumerate(zip((3, None, 5), (100.0, 200.0, 300.0))):
        block = config.block(layer)
        assert type(block) is TransformerConfig
        assert (block.sliding_window, block.rope_base) == (window, base)
        for f in dataclasses.fields(TransformerConfig):
            if f.name not in per_layer:
                assert getattr(block, f.name) == getattr(config, f.name), f.name
    assert config.sliding_layers == [0, 2]
    one = decoder(sliding_window=4)  # no per-layer list: every layer has the config's window
    assert [one.block(i).sliding_window for i in range(3)] == [4, 4, 4] and one.sliding_layers == [0, 1, 2]


def test_a_learned_table_stays_with_the_model():
    """GPT-2's table is added once by the model; its blocks see no positions."""
    config = decoder(positional="learned")
    assert config.block(0).positional == "none" and config.block(0).attention.positional == "none"


@pytest.mark.parametrize(("changes", "message"), [
    (dict(positional="alibi"), "positional is one of none, learned, rope"),
    (dict(causal=False), "causal and pre-LN"),
    (dict(norm_first=False), "causal and pre-LN"),
    (dict(sliding_windows=(3,)), "sliding_windows lists 1 layers of 3"),
    (dict(n_kv_heads=3), "must be divisible by n_kv_heads"),  # TransformerConfig's check, at once
])
def test_a_decoder_config_refuses_what_its_blocks_cannot_be(changes, message):
    with pytest.raises(ConfigError, match=message):
        decoder(**changes)


def test_old_names_still_work_and_warn():
    with pytest.warns(DeprecationWarning, match=r"DecoderConfig\(positions=\.\.\.\) is now positional"):
        old = DecoderConfig(model_type="gpt2", vocab_size=11, d_model=16, n_layers=1, n_heads=4, n_kv_heads=4,
                            d_head=4, d_ff=20, activation="gelu", norm="layer", norm_eps=1e-5, positions="learned",
                            max_positions=8)
    assert old == decoder(model_type="gpt2", n_layers=1, n_kv_heads=4, d_head=4, activation="gelu", norm="layer",
                          norm_eps=1e-5, positional="learned", max_positions=8)
    with pytest.warns(DeprecationWarning, match=r"\.positions is now \.positional"):
        assert old.positions == "learned"
    with pytest.warns(DeprecationWarning, match=r"DecoderConfig\(windows=\.\.\.\) is now sliding_windows"):
        assert decoder(windows=(None, 2, None)) == decoder(sliding_windows=(None, 2, None))
    with pytest.warns(DeprecationWarning, match=r"AttentionConfig\(qk_norm_eps=\.\.\.\) is now norm_eps"):
        eps = AttentionConfig(d_model=8, qk_norm=True, qk_norm_eps=1e-4)
    with pytest.warns(DeprecationWarning, match=r"AttentionConfig\(qk_norm_gain=\.\.\.\) is now norm_gain"):
        gain = AttentionConfig(d_model=8, qk_norm=True, qk_norm_gain="1+w")
    assert eps.norm_eps == 1e-4 and gain.norm_gain == "1+w"
    with pytest.warns(DeprecationWarning, match=r"\.qk_norm_eps is now \.norm_eps"):
        assert eps.qk_norm_eps == 1e-4


def llama_json(**more) -> dict:
    return {"model_type": "llama", "vocab_size": 11, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 20,
            "max_position_embeddings": 64, **more}


def test_a_familys_options_reach_its_blocks_by_name():
    """What Qwen3 and Gemma 3 state in their own files: options fixed, and options read from config.json."""
    shape = LlamaShape(model_type="llama", description="a test family",
                       options={"qk_norm": True, "norm_gain": "1+w", "sandwich_norm": True},
                       read_options=lambda data, read: {"scale": read.number("query_pre_attn_scalar") ** -0.5})
    config = shape.read_config(llama_json(query_pre_attn_scalar=16))
    block = config.block(1)
    assert (block.qk_norm, block.norm_gain, block.sandwich_norm) == (True, "1+w", True)
    assert (block.attention.qk_norm, block.attention.norm_gain, block.attention.scale) == (True, "1+w", 0.25)
    plain = LlamaShape(model_type="llama", description="plain").read_config(llama_json())
    assert (plain.qk_norm, plain.sandwich_norm, plain.scale) == (False, False, None)


def test_n_kv_heads_is_resolved_when_built_and_kv_heads_is_its_old_name():
    """One spelling for the key/value heads: n_kv_heads is a number once built (None meant n_heads)."""
    from selfattn.attention.points import Point

    config = AttentionConfig(d_model=8, n_heads=4)
    assert config.n_kv_heads == 4 and config == AttentionConfig(d_model=8, n_heads=4, n_kv_heads=4)
    with pytest.warns(DeprecationWarning, match=r"AttentionConfig\.kv_heads is now \.n_kv_heads"):
        assert AttentionConfig(d_model=8, n_heads=4, n_kv_heads=2).kv_heads == 2
    with pytest.warns(DeprecationWarning, match=r"\.head_size is now \.d_head"):
        assert config.head_size == 2
    point = Point("blocks.0.attn.hook_q", 0, "q", None, 0, 4, 2)
    assert point.n_kv_heads == 2 and point.kv_head(3) == 1
    with pytest.warns(DeprecationWarning, match=r"Point\.kv_heads is now \.n_kv_heads"):
        assert point.kv_heads == 2
