"""How a GGUF file's metadata and tensor names map onto a family's config.json and checkpoint names.

A GGUF file (llama.cpp's format: ollama, LM Studio and llamafile keep models in it) says
its architecture in ``general.architecture`` and keeps the model's settings as keys under
that name (``ARCH.block_count``, ``ARCH.attention.head_count``, ...). Each family that
runs such files states, in its own file, a ``GgufMap``: which architecture it takes, which
keys become which config.json fields, and what llama.cpp's converter did to the tensors
that must be undone. ``gguf_file.load_gguf`` turns the file into the config.json and the
tensor names the family already reads, so one weight table serves both.

Plain Python, no torch: the registry and the command line read these records cheaply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"GGUF"  # every GGUF file's first four bytes


def is_gguf(path) -> bool:
    """Whether ``path`` is a file that starts with GGUF's magic bytes (read without the gguf package)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == MAGIC
    except OSError:
        return False


def looks_like_gguf(path) -> bool:
    """A file named .gguf, or one that starts with GGUF's magic bytes: the GGUF loader's to read (or refuse)."""
    return str(path).lower().endswith(".gguf") or is_gguf(path)


# llama.cpp's names inside a block -> the Llama layout's names (``llama_layout.weight_rules``).
BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma's sandwich of norms: the norm after attention keeps the name post_attention_layernorm
# there, and the one before the feed-forward is pre_feedforward_layernorm.
SANDWICH_TENSORS = {
    **BLOCK_TENSORS,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# The settings every Llama-shaped architecture keeps, by the key after "ARCH.".
COMMON_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "attention.key_length": "head_dim",
}


@dataclass(frozen=True)
class GgufMap:
    """One family's reading of GGUF files.

    Attributes:
        architecture: the ``general.architecture`` this family runs (the family file says which).
        keys: key after "ARCH." -> config.json field.
        sandwich_norm: the block's tensors are Gemma's (``SANDWICH_TENSORS``).
        permute_qk: llama.cpp's converter reordered the rows of q and k for its RoPE on
            interleaved pairs; undone here, for RoPE on halves as the family runs it.
        norm_offset: added to every norm's gain on the way in (Gemma's converter stores
            1 + w where the checkpoint has w: -1 undoes it).
        extra: (metadata, config so far) -> more config.json fields the keys cannot say.
        setting_tensors: tensors that hold a setting rather than weights, by GGUF name ->
            (their values, config so far) -> more config.json fields (Llama 3's rope_freqs).
            Read before the model is built; any other name ``tensor_name`` does not know is refused.
    """

    architecture: str
    keys: Mapping[str, str] = field(default_factory=lambda: dict(COMMON_KEYS))
    sandwich_norm: bool = False
    permute_qk: bool = False
    norm_offset: float = 0.0
    extra: Callable[[Mapping[str, Any], dict], dict] | None = None
    setting_tensors: Mapping[str, Callable[[list[float], dict], dict]] = field(default_factory=dict)

    def tensor_name(self, name: str) -> str | None:
        """A GGUF tensor's name -> the checkpoint name the family reads; None for one it does not know.

        Args:
            name: "token_embd.weight", "blk.3.attn_q.weight", ...

        Returns:
            "model.embed_tokens.weight", "model.layers.3.self_attn.q_proj.weight", ...
        """
        stem, dot, kind = name.rpartition(".")
        if not dot or kind not in ("weight", "bias"):
            return None
        if stem in TOP_TENSORS:
            return f"{TOP_TENSORS[stem]}.{kind}"
        parts = stem.split(".")
        table = SANDWICH_TENSORS if self.sandwich_norm else BLOCK_TENSORS
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in table:
            return f"model.layers.{int(parts[1])}.{table[parts[2]]}.{kind}"
        return None

    def config(self, metadata: Mapping[str, Any], model_type: str) -> dict:
        """The config.json this file's metadata amounts to, for the family's own config reader.

        Args:
            metadata: every key of the file -> its value (plain Python).
            model_type: the family's model_type, written into the config.

        Returns:
            config.json's fields: the mapped keys, the vocabulary's size (the token list's
                length when the file does not say), the special ids from the tokenizer's
                keys, and tied embeddings when the file has no separate output matrix
                (``load_gguf`` sets that one from the tensors).
        """
        prefix = f"{self.architecture}."
        data: dict = {"model_type": model_type}
        for key, name in self.keys.items():
            if prefix + key in metadata:
                data[name] = metadata[prefix + key]
        tokens = metadata.get("tokenizer.ggml.tokens")
        data["vocab_size"] = metadata.get(prefix + "vocab_size", len(tokens) if isinstance(tokens, list) else None)
        for ours, theirs in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                             ("pad_token_id", "padding_token_id")):
            if f"tokenizer.ggml.{theirs}" in metadata:
                data[ours] = metadata[f"tokenizer.ggml.{theirs}"]
        if self.extra is not None:
            data.update(self.extra(metadata, data))
        return data
