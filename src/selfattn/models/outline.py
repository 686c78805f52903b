"""A model's sizes read from its config alone, without its weights: for listings that must not load.

    built-in name / folder / hub id  ->  config.json  ->  the family's read_config  ->  sizes
    llama2.c checkpoint file         ->  its header                                 ->  sizes
    GGUF file                        ->  its metadata and tensor list               ->  sizes, block types
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from selfattn.models.locate import read_config
from selfattn.models.decoder_config import DecoderConfig
from selfattn.models.files import model_folder, model_spec
from selfattn.models.locate import is_builtin, locate
from selfattn.models.ollama import is_ollama, ollama_blob
from selfattn.models.pretrained import chat_template, family_of


@dataclass(frozen=True)
class ModelOutline:
    """What a model is, in five numbers and a word.

    Attributes:
        kind: "encoder" (sees the whole text) or "decoder" (causal, generates).
        layers: attention layers.
        heads: query heads per layer.
        kv_heads: key/value heads per layer (fewer than ``heads``: grouped-query attention).
        positions: the most tokens one forward takes.
        weight_blocks: a GGUF file's block types ("Q4_1", "F32", ...) -> tensors using each;
            empty for other files.
        chat: the model carries a chat template (it was tuned to answer messages).
    """

    kind: str
    layers: int
    heads: int
    kv_heads: int
    positions: int
    weight_blocks: tuple = ()
    chat: bool = False


def outline_of(config, weight_blocks: dict | None = None, chat: bool = False) -> ModelOutline:
    """The outline of a model's config: a ``DecoderConfig`` or an encoder's ``BertConfig``; with a GGUF
    file's block types (a loaded model's ``gguf_types``) when it came from one, and whether it has a
    chat template."""
    blocks = tuple((weight_blocks or {}).items())
    if isinstance(config, DecoderConfig):
        return ModelOutline("decoder", config.n_layers, config.n_heads, config.n_kv_heads, config.max_positions, blocks,
                            chat)
    heads = config.num_attention_heads
    return ModelOutline("encoder", config.num_hidden_layers, heads, heads, config.max_position_embeddings, blocks)


def model_outline(name_or_path) -> ModelOutline:
    """The outline of the model ``load_pretrained(name_or_path)`` would load, reading no weights.

    A llama2.c checkpoint's header is checked against the file's size, so its file is read.

    Raises:
        ModelError: as ``load_pretrained`` for a name it cannot resolve or a config it refuses.
    """
    if isinstance(name_or_path, str) and not Path(name_or_path).expanduser().exists() and is_builtin(name_or_path):
        spec = model_spec(name_or_path)
        folder = model_folder(spec.name)
        if spec.checkpoint is not None:
            return _file_outline(folder / spec.checkpoint)
    elif is_ollama(name_or_path):
        return _file_outline(ollama_blob(name_or_path))
    elif isinstance(name_or_path, (str, os.PathLike)) and Path(name_or_path).expanduser().is_file():
        return _file_outline(Path(name_or_path).expanduser())
    else:
        folder = locate(name_or_path)
    data = read_config(folder)
    return outline_of(family_of(data, folder).read_config(data), chat=chat_template(folder) is not None)


def _file_outline(path: Path) -> ModelOutline:
    """A GGUF file's outline from its metadata, a llama2.c checkpoint's from its header."""
    from selfattn.models.gguf_layout import looks_like_gguf

    if looks_like_gguf(path):
        from selfattn.models.gguf_file import block_types, open_gguf, read_gguf_config
        from selfattn.models.gguf_tokenizer import metadata_fields

        reader = open_gguf(path)
        fields = metadata_fields(reader)
        config = read_gguf_config(reader, fields, path)[1]
        return outline_of(config, block_types(reader), chat=bool(fields.get("tokenizer.chat_template")))
    return _checkpoint_outline(path)


def _checkpoint_outline(path: Path) -> ModelOutline:
    from selfattn.errors import ModelError
    from selfattn.models.llama2c import config_of, read_header

    try:
        data = path.read_bytes()
    except OSError as error:
        raise ModelError(f"cannot read {path}: {error.strerror or error}") from None
    return outline_of(config_of(read_header(path, data)))
