"""GPT-2 (model_type "gpt2"): its config.json and its tensor names, onto our decoder.

GPT-2 is a pre-LN decoder with learned positions, LayerNorm with biases, GELU in its tanh
form ("gelu_new"), biases on every projection and the output matrix tied to the token
embedding. Its checkpoint stores every projection as Conv1D, (in, out): we transpose, and
c_attn holds q, k and v side by side in one (d, 3d) matrix, which we cut in three.

It is also the layout ``selfattn train`` writes (``config_json``, and ``weight_rules`` run
backwards), so transformers' GPT2LMHeadModel reads a training run's folder.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

from selfattn.models.config_fields import ConfigReader
from selfattn.models.decoder_config import DecoderConfig
from selfattn.models.family import Family
from selfattn.models.weights import WeightRule, rule, split_columns, transposed

KIND = "decoder"  # read without importing this file (families.family_kinds), for the command line's help

MODEL_TYPE = "gpt2"
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
REFUSED = {
    "add_cross_attention": "cross-attention",
    "scale_attn_by_inverse_layer_idx": "scores scaled by 1 / layer index",
}
# Saved buffers, not weights: the causal mask of older checkpoints.
_MASK_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


def read_config(data: dict) -> DecoderConfig:
    """A GPT-2 config.json -> ``DecoderConfig``; refuses what our blocks do not compute.

    Args:
        data: the parsed config.json.

    Returns:
        The decoder's config.

    Raises:
        ModelError: a required field is missing or mistyped, or the config asks for
            something else (cross-attention, scaling by layer index, unscaled scores, an
            unknown activation), naming the field.
    """
    read = ConfigReader(data, MODEL_TYPE)
    d = read.int("n_embd")
    heads = read.int("n_head")
    for name, what in REFUSED.items():
        read.refuse_true(name, what)
    read.require_true("scale_attn_weights", "scores divided by sqrt(d_head)")
    eos = read.ids("eos_token_id", default=50256)
    return DecoderConfig(
        model_type=MODEL_TYPE,
        vocab_size=read.int("vocab_size"),
        d_model=d,
        n_layers=read.int("n_layer"),
        n_heads=heads,
        n_kv_heads=heads,
        d_head=read.divide(d, heads, "n_embd", "n_head"),
        d_ff=read.int("n_inner", default=4 * d, allow_null=True),
        activation=read.choice("activation_function", ACTIVATIONS, default="gelu_new"),
        norm="layer",
        norm_eps=read.number("layer_norm_epsilon", default=1e-5),
        positional="learned",
        max_positions=read.int("n_positions"),
        bias=True,
        attention_bias=True,
        out_bias=True,
        tie_embeddings=read.bool("tie_word_embeddings", default=True),
        bos_id=read.optional_id("bos_token_id"),
        eos_ids=eos,
        pad_id=read.optional_id("pad_token_id") or (eos[0] if eos else 0),
    )


def config_json(config: DecoderConfig, initializer_range: float = 0.02) -> dict:
    """GPT2LMHeadModel's config.json for ``config``, which ``read_config`` reads back (no dropout).

    Args:
        config: a decoder in GPT-2's layout (learned positions, LayerNorm, tanh GELU, tied).
        initializer_range: the standard deviation the weights were drawn with, recorded.

    Returns:
        The JSON object, keys in the order the file is written.
    """
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": MODEL_TYPE, "vocab_size": config.vocab_size,
        "n_embd": config.d_model, "n_layer": config.n_layers, "n_head": config.n_heads,
        "n_positions": config.max_positions, "n_inner": config.d_ff, "activation_function": "gelu_new",
        "layer_norm_epsilon": config.norm_eps, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "tie_word_embeddings": True, "initializer_range": initializer_range,
        "bos_token_id": config.bos_id if config.bos_id is not None else config.eos_ids[0],
        "eos_token_id": config.eos_ids[0], "pad_token_id": config.pad_id, "torch_dtype": "float32",
    }


def weight_rules(config: DecoderConfig, prefix: str) -> list[WeightRule]:
    """GPT-2's tensor names -> ours. ``prefix`` is "transformer." (GPT2LMHeadModel) or "" (GPT2Model)."""
    p = prefix
    rules = [rule(f"{p}wte.weight", "embed.weight"), rule(f"{p}wpe.weight", "position.weight")]
    for i in range(config.n_layers):
        theirs, ours = f"{p}h.{i}.", f"layers.{i}."
        a = ours + "attention."
        rules += [
            rule(theirs + "ln_1.weight", ours + "norm1.weight"),
            rule(theirs + "ln_1.bias", ours + "norm1.bias"),
            split_columns(theirs + "attn.c_attn.weight", (a + "w_q.weight", a + "w_k.weight", a + "w_v.weight"), True),
            split_columns(theirs + "attn.c_attn.bias", (a + "w_q.bias", a + "w_k.bias", a + "w_v.bias"), False),
            transposed(theirs + "attn.c_proj.weight", a + "w_o.weight"),
            rule(theirs + "attn.c_proj.bias", a + "w_o.bias"),
            rule(theirs + "ln_2.weight", ours + "norm2.weight"),
            rule(theirs + "ln_2.bias", ours + "norm2.bias"),
            transposed(theirs + "mlp.c_fc.weight", ours + "feed_forward.linear1.weight"),
            rule(theirs + "mlp.c_fc.bias", ours + "feed_forward.linear1.bias"),
            transposed(theirs + "mlp.c_proj.weight", ours + "feed_forward.linear2.weight"),
            rule(theirs + "mlp.c_proj.bias", ours + "feed_forward.linear2.bias"),
        ]
    rules += [rule(f"{p}ln_f.weight", "norm.weight"), rule(f"{p}ln_f.bias", "norm.bias")]
    if not config.tie_embeddings:
        rules.append(rule("lm_head.weight", "lm_head.weight"))
    return rules


def checkpoint_prefix(names: Collection[str]) -> str:
    """"transformer." when the checkpoint was saved from GPT2LMHeadModel, "" from GPT2Model."""
    return "transformer." if "transformer.wte.weight" in names else ""


def ignored(config: DecoderConfig, prefix: str) -> Callable[[str], bool]:
    """Which checkpoint names are known and unused: saved mask buffers, a stored copy of a tied output matrix."""
    def check(name: str) -> bool:
        if name == "lm_head.weight":
            return config.tie_embeddings
        return bool(_MASK_BUFFERS.fullmatch(name.removeprefix(prefix)))

    return check


def weight_table(config: DecoderConfig, names: Collection[str]) -> tuple[list[WeightRule], Callable[[str], bool]]:
    """The rules and the ignored names for this checkpoint, whichever class saved it.

    Args:
        config: the decoder's config.
        names: the checkpoint's tensor names (they tell GPT2LMHeadModel from GPT2Model).

    Returns:
        (rules, ignored), as ``copy_weights`` takes them.
    """
    prefix = checkpoint_prefix(names)
    return weight_rules(config, prefix), ignored(config, prefix)


FAMILY = Family(
    model_type=MODEL_TYPE,
    kind=KIND,
    description="GPT-2 decoders: learned positions, pre-LN LayerNorm, tanh GELU, q, k and v fused in one Conv1D",
    read_config=read_config,
    weight_table=weight_table,
    refused=REFUSED,
)
