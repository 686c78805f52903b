"""BERT (model_type "bert"): its config.json and its tensor names, onto our encoder.

BERT is a post-LN encoder with learned positions, token type embeddings and exact (erf)
GELU; all-MiniLM-L6-v2, the built-in model, is one. The network is ``BertModel``
(models/encoder.py); this file reads the config, maps every checkpoint tensor by name
(``weight_mapping``), and loads: every checkpoint tensor must be used or knowingly ignored
(checked before anything is copied), and every shape must fit.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

import torch

from selfattn.errors import ModelError
from selfattn.models.locate import read_config as read_config_file
from selfattn.models.checkpoint import read_weights
from selfattn.models.encoder import BertConfig, BertModel
from selfattn.models.family import Family
from selfattn.models.tokenizer import WordPieceTokenizer
from selfattn.models.weights import WeightRule, rule

KIND = "encoder"  # read without importing this file (families.family_kinds), for the command line's help

MODEL_TYPE = "bert"
# Checkpoints saved from BertForMaskedLM / BertForPreTraining keep the encoder under this
# prefix and their heads (which we do not run) under "cls.".
ENCODER_PREFIX = "bert."

# Checkpoint tensors we do not use: the pooler (a tanh layer for the [CLS] vector, unused
# by mean pooling) and position_ids (a saved arange, not a weight).
IGNORED_KEYS = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")

_LAYER_MAP = {  # BERT's name in layer i -> ours in encoder.layers.i
    "attention.self.query": "attention.w_q",
    "attention.self.key": "attention.w_k",
    "attention.self.value": "attention.w_v",
    "attention.output.dense": "attention.w_o",
    "attention.output.LayerNorm": "norm1",  # post-LN: LN(x + Attn(x))
    "intermediate.dense": "feed_forward.linear1",
    "output.dense": "feed_forward.linear2",
    "output.LayerNorm": "norm2",  # post-LN: LN(x + FFN(x))
}
_EMBEDDING_MAP = {
    "embeddings.word_embeddings": "embeddings.word",
    "embeddings.position_embeddings": "embeddings.position",
    "embeddings.token_type_embeddings": "embeddings.token_type",
    "embeddings.LayerNorm": "embeddings.norm",
}


def read_config(data: dict) -> BertConfig:
    """A BERT config.json -> ``BertConfig``; fields it does not know are ignored.

    Args:
        data: the parsed config.json.

    Returns:
        The encoder's config.

    Raises:
        ModelError: not a BERT config with absolute positions, an activation other
            than "gelu", or a required field is missing.
    """
    if data.get("model_type") != MODEL_TYPE or data.get("position_embedding_type", "absolute") != "absolute":
        raise ModelError("config.json does not describe a BERT encoder with absolute positions")
    if data.get("hidden_act", "gelu") != "gelu":
        raise ModelError(f"unsupported activation {data.get('hidden_act')!r}: this loader knows BERT's exact GELU")
    try:
        return BertConfig(**{name: data[name] for name in BertConfig.__dataclass_fields__ if name in data})
    except TypeError as error:
        raise ModelError(f"config.json lacks a field: {error}") from None


def weight_mapping(config: BertConfig) -> dict[str, str]:
    """Checkpoint tensor name -> our parameter name, for every tensor we load.

    Args:
        config: the encoder's config (its number of layers).

    Returns:
        The mapping, for a checkpoint saved from BertModel (no prefix).
    """
    mapping = {}
    for theirs, ours in _EMBEDDING_MAP.items():
        for kind in ("weight",) if ours != "embeddings.norm" else ("weight", "bias"):
            mapping[f"{theirs}.{kind}"] = f"{ours}.{kind}"
    for layer in range(config.num_hidden_layers):
        for theirs, ours in _LAYER_MAP.items():
            for kind in ("weight", "bias"):
                mapping[f"encoder.layer.{layer}.{theirs}.{kind}"] = f"encoder.layers.{layer}.{ours}.{kind}"
    return mapping


def weight_table(config: BertConfig, names: Collection[str]) -> tuple[list[WeightRule], Callable[[str], bool]]:
    """``weight_mapping`` as rules for ``copy_weights``, the heads' prefix handled as ``load_bert`` does.

    Args:
        config: the encoder's config.
        names: the checkpoint's tensor names (an encoder under "bert." means a model
            saved with its heads, which are ignored).

    Returns:
        (rules, ignored): one plain copy per mapped tensor, and the names known and unused.
    """
    prefix = ENCODER_PREFIX if any(n.startswith(ENCODER_PREFIX) for n in names) else ""
    rules = [rule(prefix + theirs, ours) for theirs, ours in weight_mapping(config).items()]
    unused = {prefix + key for key in IGNORED_KEYS}
    return rules, lambda name: name in unused or not name.startswith(prefix)


def load_weights(model: BertModel, state: dict[str, torch.Tensor]) -> None:
    """Copy checkpoint tensors into the model by the explicit mapping; refuse any mismatch.

    Args:
        model: the encoder to fill; its parameters are overwritten in place.
        state: checkpoint name -> tensor, without the "bert." prefix.

    Raises:
        ModelError: tensors are missing or unexpected (the first five of each named,
            before anything is copied), or a tensor's shape does not fit its parameter.
    """
    mapping = weight_mapping(model.config)
    ours = dict(model.named_parameters())
    unexpected = sorted(set(state) - set(mapping) - set(IGNORED_KEYS))
    missing = sorted(set(mapping) - set(state))
    if unexpected or missing:
        raise ModelError(f"checkpoint does not fit BERT: missing {missing[:5]}, unexpected {unexpected[:5]}")
    assert len(mapping) == len(ours), f"mapping covers {len(mapping)} tensors, the model has {len(ours)} parameters"
    assert set(mapping.values()) == set(ours), "the mapping must name every parameter exactly once"
    with torch.no_grad():
        for theirs, name in mapping.items():
            tensor = state[theirs]
            if tensor.shape != ours[name].shape:
                raise ModelError(f"{theirs} has shape {tuple(tensor.shape)}, {name} needs {tuple(ours[name].shape)}")
            ours[name].copy_(tensor)


def load_bert(folder: Path, name: str, state: dict[str, torch.Tensor] | None = None) -> BertModel:
    """A BERT encoder from a Hugging Face folder (config.json, tokenizer.json, weights), frozen, eval mode.

    A checkpoint saved with its heads keeps the encoder under "bert." and the heads under
    "cls.": the encoder is read and the heads are left out.

    Args:
        folder: the model folder.
        name: the model's name, for its outputs.
        state: the checkpoint's tensors when already read; None reads them from the folder.

    Returns:
        The ``BertModel`` with the checkpoint's weights, frozen, in eval mode.

    Raises:
        ModelError: the config is not BERT's, or the checkpoint does not fit it.
    """
    config = read_config(read_config_file(folder))
    tokenizer = WordPieceTokenizer(folder / "tokenizer.json", config.max_position_embeddings, config.pad_token_id)
    model = BertModel(config, tokenizer, name)
    state = read_weights(folder) if state is None else state
    if any(key.startswith(ENCODER_PREFIX) for key in state):
        state = {key[len(ENCODER_PREFIX):]: t for key, t in state.items() if key.startswith(ENCODER_PREFIX)}
    load_weights(model, state)
    return model.eval().requires_grad_(False)


FAMILY = Family(
    model_type=MODEL_TYPE,
    kind=KIND,
    description="BERT encoders: post-LN blocks, learned positions, exact GELU (all-MiniLM-L6-v2 is one)",
    read_config=read_config,
    weight_table=weight_table,
    refused={},
    load=load_bert,
)
