"""A GGUF file (llama.cpp, ollama, LM Studio) as one of our decoders.

    file -> gguf.GGUFReader -> metadata: general.architecture picks the family (registry)
         -> the family's GgufMap: metadata (and tensors that hold settings, Llama 3's
            rope_freqs) -> config.json fields -> the family's config reader
         -> tensors: dequantized to float32 by gguf (numpy), renamed to the checkpoint names
            the family's weight table reads, llama.cpp's reorderings undone
         -> the tokenizer from the file's own tokenizer.ggml.* keys (``gguf_tokenizer``)

ggml-org's ``gguf`` package reads the file and knows every block type (Q4_0 ... Q8_0, the
k-quants, the i-quants); the attention math stays ours. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from selfattn.errors import ModelError
from selfattn.models.decoder import DecoderModel
from selfattn.models.gguf_layout import GgufMap, is_gguf
from selfattn.models.gguf_tokenizer import metadata_fields, tokenizer_from_metadata
from selfattn.models.locate import first_sentence
from selfattn.models.registry import gguf_families, one_of
from selfattn.models.tokenizer import TextTokenizer
from selfattn.models.weights import copy_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def open_gguf(path: Path):
    """The file's ``gguf.GGUFReader``; a file that is not GGUF, or is cut short, is one ModelError line."""
    try:
        import gguf
    except ImportError:
        raise ModelError("reading a GGUF file needs the gguf package: python -m pip install gguf") from None
    if not is_gguf(path):
        raise ModelError(f"{path} is not a GGUF file (it does not start with the bytes GGUF)")
    try:
        return _reader_class(gguf)(str(path))
    except Exception as error:  # noqa: BLE001 -- a file that gguf cannot parse is the user's to replace
        reason = first_sentence(str(error)) or type(error).__name__
        raise ModelError(f"cannot read {path} as GGUF (truncated or damaged?): {reason}") from None


@lru_cache(maxsize=1)
def _reader_class(gguf):
    """gguf's reader over a plain view of its memory map: it slices the map once per metadata item
    (a vocabulary of 49,152 strings and their merges: about a million slices), and a slice of an
    ``np.memmap`` costs several times one of an ``np.ndarray`` (SmolLM2's file opens in 0.7 s, not 2.3 s).
    The bytes are the same mapped pages either way."""

    class PlainViewReader(gguf.GGUFReader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value):
            self._plain = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return PlainViewReader


def block_types(reader) -> dict[str, int]:
    """The file's block types ("Q4_1", "Q8_0", "F32", ...) -> how many tensors use each, most used first."""
    counts = Counter(t.tensor_type.name for t in reader.tensors)
    return dict(counts.most_common())


def load_gguf(path: str | os.PathLike, name: str | None = None, dtype: str | torch.dtype = "float32") -> DecoderModel:
    """A GGUF file's model as our decoder, frozen and in eval mode.

    Args:
        path: the .gguf file.
        name: what the model's outputs call it (default: the file's name without .gguf).
        dtype: the weights' dtype after dequantizing: "float32" (default), "bfloat16"
            (half the memory) or "float16".

    Returns:
        A ``DecoderModel`` with the file's tokenizer; ``model.gguf_types`` says which
            block types the file held (so a learner knows the weights were quantized).

    Raises:
        ModelError: not a GGUF file, cut short, an architecture no family runs (the
            message lists those that do), a block type gguf cannot dequantize, a tensor
            the family does not know, or metadata (or a tensor holding a setting, such as
            rope_freqs) the family's config refuses.
    """
    path = Path(path).expanduser()
    torch_dtype = _dtype(dtype)
    reader = open_gguf(path)
    fields = metadata_fields(reader)  # every key as plain Python; a tokenizer string not in UTF-8 read with U+FFFD
    family, config = read_gguf_config(reader, fields, path)
    tokenizer = TextTokenizer.from_tokenizer(_tokenizer(fields, path), config.max_positions, config.pad_id,
                                             padding_side="left")
    model = DecoderModel(config, tokenizer, name or path.name.removesuffix(".gguf"))
    state = _tensors(reader, family.gguf, config, path, torch_dtype)
    rules, ignored = family.weight_table(config, state.keys())
    copy_weights(model.to(torch_dtype), state, rules, ignored, family.model_type)
    model.gguf_types = block_types(reader)
    model.chat_template = fields.get("tokenizer.chat_template")
    return model.eval().requires_grad_(False)


def read_gguf_config(reader, fields: dict, path: Path):
    """(family, its ``DecoderConfig``) from the file's metadata, tensor names and the tensors that hold settings."""
    family = _family(fields, path)
    readers = family.gguf.setting_tensors
    settings = {t.name: _values(t, path).flatten().tolist() for t in reader.tensors if t.name in readers}
    try:
        data = family.gguf.config(fields, family.model_type)
        for name, values in settings.items():
            data.update(readers[name](values, data))
    except ModelError as error:
        raise ModelError(f"{path}: {error}") from None
    names = {t.name for t in reader.tensors}
    data.setdefault("tie_word_embeddings", "output.weight" not in names)
    try:
        config = family.read_config(data)
    except ModelError as error:
        raise ModelError(f"{path}: {str(error).replace('config.json', 'the GGUF metadata')}") from None
    eot = fields.get("tokenizer.ggml.eot_token_id")
    eos = tuple(dict.fromkeys([*config.eos_ids, *([eot] if isinstance(eot, int) else [])]))
    return family, dataclasses.replace(config, eos_ids=eos, attn_impl="flash")


def _dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ModelError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def _family(fields: dict, path: Path):
    architecture = fields.get("general.architecture")
    known = gguf_families()
    family = known.get(architecture) if isinstance(architecture, str) else None
    if family is None:
        raise ModelError(f"{path} holds a {architecture!r} model: selfattn runs GGUF architectures "
                         f"{one_of(tuple(sorted(known)))}")
    return family


def _tokenizer(fields: dict, path: Path):
    try:
        return tokenizer_from_metadata(fields)
    except ModelError as error:
        raise ModelError(f"{path}: {error}") from None


def _tensors(reader, layout: GgufMap, config, path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every weight tensor of the file under the family's checkpoint name, dequantized, reorderings undone
    (the tensors that hold settings went into the config: ``read_gguf_config``)."""
    state = {}
    for tensor in reader.tensors:
        if tensor.name in layout.setting_tensors:
            continue
        target = layout.tensor_name(tensor.name)
        if target is None:
            raise ModelError(f"{path}: tensor {tensor.name} is not one the {layout.architecture} layout has")
        values = _values(tensor, path)
        if layout.permute_qk and tensor.name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = config.n_heads if ".attn_q." in tensor.name else config.n_kv_heads
            values = _unpermute(values, heads)
        if layout.norm_offset and tensor.name.endswith("norm.weight"):
            values = values + np.float32(layout.norm_offset)
        state[target] = torch.from_numpy(values if values.flags.writeable else values.copy()).to(dtype)
    return state


def _values(tensor, path: Path) -> np.ndarray:
    """One tensor of the file dequantized to float32, in the checkpoint's (rows, columns) order."""
    import gguf

    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except (NotImplementedError, ValueError, KeyError) as error:
        raise ModelError(f"{path}: cannot dequantize {tensor.name}, block type {tensor.tensor_type.name}: "
                         f"{first_sentence(str(error)) or type(error).__name__}") from None
    return np.ascontiguousarray(values.reshape([int(n) for n in reversed(tensor.shape)]), dtype=np.float32)


def _unpermute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter stored each head's rows of q (and k) as pairs (r, r + d/2) side by side,
    for its RoPE on interleaved pairs; this puts them back in halves, for RoPE on i and i + d/2.

    weights: (heads * d, width), rows per head in the order 0, d/2, 1, d/2 + 1, ... -> 0, 1, ..., d - 1.
    """
    rows, width = weights.shape[0], weights.shape[1:]
    half = rows // heads // 2
    return weights.reshape(heads, half, 2, *width).swapaxes(1, 2).reshape(rows, *width)
