"""Tiny random checkpoints of every family we load, made offline with transformers' own classes.

Each is built from transformers' config class, its weights drawn with std 0.2 (the default
0.02 leaves attention nearly uniform, where a wrong scale or mask hides), its norms' gains
and biases jittered too (the q/k norms' gains widely), and saved with ``save_pretrained`` into a folder in the Hugging
Face layout, beside a tokenizer trained here with ``tokenizers``: byte-level BPE for the
decoders, all-MiniLM-L6-v2's WordPiece for BERT. Nothing is downloaded.

    folder = tiny_checkpoint("llama", tmp_path)       # config.json, model.safetensors, tokenizer.json
    reference = reference_model(folder)               # transformers, eager attention, eval mode
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma3_text", "bert")
DECODERS = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma3_text")
VOCAB = 320  # the trained BPE's size: 256 bytes, the specials and some merges
CORPUS = [
    "The cat sat on the warm mat.",
    "A dog lay by the door and the cat watched it.",
    "Attention lets every token look at the others, weighted by how well they match.",
    "The quick brown fox jumps over the lazy dog, again and again.",
    "Queries ask, keys answer, values are what gets mixed.",
] * 20
SPECIALS = ("<|endoftext|>", "<s>", "</s>", "<pad>")
# q_norm / k_norm (Qwen3, Gemma 3) make every head's q and k about unit size, whatever the
# weights: their gains, drawn around 1 with this spread, are what keeps attention far from
# uniform (0.1 leaves the largest weight of a row near 0.4; 1.5 puts it at 0.8-0.99).
QK_GAIN_SPREAD = 1.5


def _sizes() -> dict:
    return dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)


def tiny_config(family: str, **overrides):
    """transformers' config for a tiny model of ``family``, std 0.2 init; overrides win."""
    import transformers

    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    if family == "gpt2":
        fields = dict(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, n_inner=96,
            bos_token_id=0, eos_token_id=0, pad_token_id=3,
        )
        cls = transformers.GPT2Config
    elif family == "llama":  # GQA, tied embeddings, Llama 3.2's rope scaling (small window so it bites)
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
        fields = dict(_sizes(), num_key_value_heads=2, max_position_embeddings=64, rope_parameters=rope,
                      tie_word_embeddings=True, **ids)
        cls = transformers.LlamaConfig
    elif family == "mistral":  # GQA and a sliding window shorter than the test texts
        fields = dict(_sizes(), num_key_value_heads=2, max_position_embeddings=64, sliding_window=5,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, **ids)
        cls = transformers.MistralConfig
    elif family == "qwen2":  # qkv biases, multi-query, the last layer windowed
        fields = dict(_sizes(), num_key_value_heads=1, max_position_embeddings=64, use_sliding_window=True,
                      sliding_window=6, max_window_layers=1, **ids)
        cls = transformers.Qwen2Config
    elif family == "qwen3":  # GQA, head_dim 24 (not 64 / 4), q/k norms, the last layer windowed
        fields = dict(_sizes(), num_key_value_heads=2, head_dim=24, max_position_embeddings=64,
                      rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, use_sliding_window=True,
                      sliding_window=6, max_window_layers=1, **ids)
        cls = transformers.Qwen3Config
    elif family == "gemma3_text":
        # A sliding layer (window 5, shorter than the texts) then a full one, each with its own RoPE base
        # far from the other's; width 48 so that sqrt(width) is not a round number; head_dim 16, not
        # 48 / 4, and scores scaled by 1 / sqrt(12), not 1 / sqrt(16).
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 20.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}}
        fields = dict(_sizes(), hidden_size=48, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=12,
                      max_position_embeddings=64, sliding_window=5, layer_types=["sliding_attention", "full_attention"],
                      rope_parameters=rope, **ids)
        cls = transformers.Gemma3TextConfig
    elif family == "bert":
        fields = dict(vocab_size=30522, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=64, pad_token_id=0)
        cls = transformers.BertConfig
    else:
        raise ValueError(family)
    fields.update(initializer_range=0.2)
    fields.update(overrides)
    return cls(**fields)


def build_reference(config, seed: int = 0):
    """The transformers model for ``config``: weights std 0.2, norms jittered, eval, eager attention."""
    import torch
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config) if config.model_type != "bert" else (
        transformers.BertModel(config)
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):  # q and k of unit size: spread the gains
                param.add_(QK_GAIN_SPREAD * torch.randn_like(param))  # so that attention is far from uniform
            elif "norm" in name.lower() or "ln_" in name:  # gains near 1, biases near 0, but not exactly
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.normal_(0.0, 0.2)
    return model.eval()


def tiny_checkpoint(family: str, folder: Path, seed: int = 0, **overrides) -> Path:
    """Save a tiny random ``family`` model and its tokenizer into ``folder`` (made if missing)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = build_reference(tiny_config(family, **overrides), seed)
    model.save_pretrained(folder)
    write_tokenizer(family, folder)
    return folder


def write_tokenizer(family: str, folder: Path) -> None:
    """tokenizer.json (and tokenizer_config.json) for ``family`` into ``folder``."""
    if family == "bert":
        from selfattn.models.files import model_folder

        source = model_folder("all-MiniLM-L6-v2")
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            if (source / name).is_file():
                shutil.copy(source / name, folder / name)
        return
    (folder / "tokenizer.json").write_text(_bpe_json(family in ("llama", "gemma3_text")), encoding="utf-8")
    import json

    bos, eos = ("<|endoftext|>", "<|endoftext|>") if family == "gpt2" else ("<s>", "</s>")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "pad_token": "<pad>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


@lru_cache(maxsize=2)
def _bpe_json(add_bos: bool) -> str:
    """A byte-level BPE trained on CORPUS; with add_bos its post-processor puts <s> first (as Llama's and Gemma's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=list(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    if add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    assert tokenizer.get_vocab_size() <= VOCAB
    return tokenizer.to_str()


def reference_model(folder: Path, attn_implementation: str = "eager"):
    """transformers' model read back from ``folder``, offline, in eval mode."""
    transformers = pytest.importorskip("transformers")
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    cls = transformers.BertModel if config.model_type == "bert" else transformers.AutoModelForCausalLM
    model = cls.from_pretrained(folder, attn_implementation=attn_implementation, local_files_only=True)
    return model.eval()


def reference_tokenizer(folder: Path, padding_side: str = "left"):
    """transformers' fast tokenizer read from ``folder``, padding on ``padding_side``."""
    transformers = pytest.importorskip("transformers")

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def position_ids(attention_mask):
    """Positions counted over the real tokens only (left padding shifts them), as generate does."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)


def halves(weight, heads: int):
    """Rows of wq / wk from llama2.c's interleaved RoPE pairs to transformers' halves, head by head.

    Within each head, rows (0, 1), (2, 3), ... are RoPE's pairs in llama2.c; transformers
    turns row i with row i + d_head/2, so the even rows go first and the odd rows after.
    """
    out, d_in = weight.shape
    return weight.view(heads, out // heads // 2, 2, d_in).transpose(1, 2).reshape(out, d_in)


def llama2c_as_transformers(path, attn_implementation: str = "eager", eos_token_id: int | None = 2):
    """transformers' LlamaForCausalLM holding a llama2.c checkpoint's weights, eval mode.

    The weights come from ``selfattn.models.llama2c.read_checkpoint`` (Llama tensor names,
    wq / wk rows in llama2.c's order) and go through ``halves``; everything else is copied
    as it is. RMSNorm eps 1e-5 and RoPE base 10000, as llama2.c's run.c.
    """
    import transformers

    from selfattn.models.llama2c import read_checkpoint

    header, tensors = read_checkpoint(path)
    config = transformers.LlamaConfig(
        vocab_size=header.vocab_size, hidden_size=header.dim, intermediate_size=header.hidden_dim,
        num_hidden_layers=header.n_layers, num_attention_heads=header.n_heads, num_key_value_heads=header.n_kv_heads,
        max_position_embeddings=header.seq_len, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=header.shared_classifier, bos_token_id=1, eos_token_id=eos_token_id, pad_token_id=0,
    )
    config._attn_implementation = attn_implementation
    heads = {"q_proj": header.n_heads, "k_proj": header.n_kv_heads}  # the rows RoPE turns
    state = {}
    for name, tensor in tensors.items():
        kind = name.split(".")[-2]  # model.layers.{i}.self_attn.q_proj.weight -> q_proj
        state[name] = halves(tensor, heads[kind]) if kind in heads else tensor.clone()
    if header.shared_classifier:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    llama = transformers.LlamaForCausalLM(config)
    missing, unexpected = llama.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return llama.eval()
