"""The model we train: a GPT-2 decoder from our own modules, and its checkpoint in GPT-2's layout.

GPT-2 is the family nanoGPT trains (learned positions, pre-LN LayerNorm, GELU-tanh, tied
embeddings), so a run's folder is a GPT-2 checkpoint that ``selfattn.load_pretrained`` and
transformers' ``GPT2LMHeadModel`` both read: config.json, model.safetensors (Conv1D
layout, q/k/v fused into c_attn, written by running the GPT-2 family's weight table
backwards) and the tokenizer.

Initialisation as GPT-2's paper and nanoGPT: every weight and embedding N(0, 0.02), the
projections that write into the residual stream (W_o and the second feed-forward layer)
N(0, 0.02 / sqrt(2 L)), biases 0, norms gain 1.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from selfattn.models.decoder import DecoderConfig, DecoderModel
from selfattn.models.families import gpt2
from selfattn.models.weights import export_weights
from selfattn.training.vocab import CharVocab

INIT_STD = 0.02


def model_config(vocab: CharVocab, context: int, n_layers: int, n_heads: int, d_model: int, attn_impl: str) -> DecoderConfig:
    """The ``DecoderConfig`` of a GPT-2 model of these sizes over ``vocab``.

    Args:
        vocab: the vocabulary (its size, and ``<s>`` as begin and end when it has one).
        context: the learned positions.
        n_layers: blocks.
        n_heads: heads per block; d_model / n_heads is the head width.
        d_model: the width; the feed-forward layer is 4 times wider.
        attn_impl: "reference" or "flash".

    Returns:
        The config; ``ConfigError`` on sizes that do not fit.
    """
    special = vocab.bos_id if vocab.bos_id is not None else vocab.unk_id
    return DecoderConfig(
        model_type=gpt2.MODEL_TYPE, vocab_size=vocab.size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=n_heads, d_head=d_model // n_heads, d_ff=4 * d_model, activation="gelu_tanh", norm="layer",
        norm_eps=1e-5, positional="learned", max_positions=context, bias=True, attention_bias=True, out_bias=True,
        tie_embeddings=True, bos_id=vocab.bos_id, eos_ids=(special,), pad_id=special, attn_impl=attn_impl,
    )


def new_model(config: DecoderConfig, seed: int, tokenizer=None, name: str = "trained") -> DecoderModel:
    """A freshly initialised model (GPT-2's initialisation, see the module docstring), in training mode."""
    torch.manual_seed(seed)
    model = DecoderModel(config, tokenizer, name)
    residual_std = INIT_STD / math.sqrt(2 * config.n_layers)
    with torch.no_grad():
        for name_, param in model.named_parameters():
            if ".norm" in name_ or name_.startswith("norm."):
                param.fill_(1.0 if name_.endswith("weight") else 0.0)
            elif name_.endswith("bias"):
                param.zero_()
            elif name_.endswith(("w_o.weight", "linear2.weight")):
                param.normal_(0.0, residual_std)
            else:
                param.normal_(0.0, INIT_STD)
    return model.train()


def config_json(config: DecoderConfig) -> dict:
    """config.json of GPT2LMHeadModel for ``config``, as the GPT-2 family reads it back; records INIT_STD."""
    return gpt2.config_json(config, initializer_range=INIT_STD)


def save_model(model: DecoderModel, vocab: CharVocab, folder: Path) -> None:
    """The model as a GPT-2 checkpoint in ``folder``: config.json, model.safetensors, the tokenizer.

    model.safetensors is written to a temporary name and renamed, so an interruption leaves
    the previous checkpoint whole.
    """
    from safetensors.torch import save_file

    module = getattr(model, "module", model)  # DistributedDataParallel wraps the model
    state = export_weights(module, gpt2.weight_rules(module.config, "transformer."))
    temporary = folder / "model.safetensors.partial"
    save_file(state, str(temporary), metadata={"format": "pt"})
    os.replace(temporary, folder / "model.safetensors")
    write_json(folder / "config.json", config_json(module.config))
    write_json(folder / "generation_config.json", {"eos_token_id": module.config.eos_ids[0],
                                                   "pad_token_id": module.config.pad_id})
    vocab.save(folder)


def write_json(path: Path, data) -> None:
    """``data`` as indented JSON, written whole or not at all (temporary file, then rename)."""
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)
