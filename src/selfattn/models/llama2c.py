"""llama2.c checkpoints: Andrej Karpathy's own binary format for small Llamas, read into our decoder.

    file -> header (7 sizes) -> float32 arrays in a fixed order -> Llama tensor names
         -> the Llama family's weight table -> ``DecoderModel`` (RoPE on interleaved pairs)

llama2.c (github.com/karpathy/llama2.c) trains Llamas on TinyStories and writes them for
its C program ``run.c``: stories260K, 15M, 42M and 110M are in this format. Two float32
versions exist:

    version 0 ("legacy"): 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
        vocab_size, seq_len; vocab_size < 0 means the output matrix is stored, not shared),
        then: token embedding, attention norms, wq, wk, wv, wo, feed-forward norms, w1,
        w2, w3, final norm, two RoPE tables (seq_len x d_head / 2 each, unused here:
        we compute RoPE), and the output matrix when it is not shared.
    version 1: the magic "ak42" (0x616b3432), the version, the 7 int32, one byte "the
        output is shared", zeros up to byte 256; then the attention and feed-forward norms,
        the final norm, the token embedding, wq, wk, wv, wo, w1, w2, w3, and the output
        matrix when not shared.

Every matrix is stored (out, in), as ``nn.Linear`` keeps it. Version 2 is int8 (Q8_0)
quantised and is refused by name. The model is the Llama our families already run, with
two differences that are data: RoPE turns interleaved pairs (x[2i], x[2i+1]) instead of
halves, which our attention computes directly (``rope_pairs="interleaved"``), so the
weights are used exactly as trained; and RMSNorm's epsilon is 1e-5. The tokenizer is
llama2.c's own format too (``Llama2cTokenizer``); generation stops where llama2.c's
sampler stops: when the next token would be BOS.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from selfattn.errors import ModelError
from selfattn.models.decoder import DecoderConfig, DecoderModel
from selfattn.models.families.llama import MODEL_TYPE as LLAMA
from selfattn.models.llama2c_tokenizer import Llama2cTokenizer
from selfattn.models.llama_layout import weight_table
from selfattn.models.weights import copy_weights

MAGIC = 0x616B3432  # "ak42" read as a little-endian uint32: the first 4 bytes of versions 1 and 2
HEADER_V1 = 256  # versions 1 and 2 pad their header to this many bytes
FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
BOS, UNK = 1, 0
NORM_EPS = 1e-5  # run.c's rmsnorm adds 1e-5 to the mean square
ROPE_BASE = 10000.0


@dataclass(frozen=True)
class Llama2cHeader:
    """What a llama2.c checkpoint's header says.

    Attributes:
        version: 0 (legacy) or 1.
        dim: the model width.
        hidden_dim: the feed-forward network's hidden width.
        n_layers: blocks.
        n_heads: query heads.
        n_kv_heads: key/value heads (fewer: grouped-query attention).
        vocab_size: tokens in the vocabulary.
        seq_len: positions the model was trained on.
        shared_classifier: the output matrix is the token embedding.
        offset: where the weights start, in bytes.
    """

    version: int
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: bool
    offset: int

    @property
    def d_head(self) -> int:
        """The width of one head, dim / n_heads."""
        return self.dim // self.n_heads

    def arrays(self) -> list[tuple[str, tuple[int, ...]]]:
        """The float32 arrays after the header, in file order: (name, shape), per layer stacked.

        Names are the Llama tensor names (``model.layers.{i}.`` left out: "layers.wq" is
        every layer's wq, (n_layers, out, in)); "rope" is the unused RoPE tables of version 0.
        """
        d, h, n, kv = self.dim, self.hidden_dim, self.n_layers, self.n_kv_heads * self.d_head
        attention = [("layers.self_attn.q_proj.weight", (n, d, d)), ("layers.self_attn.k_proj.weight", (n, kv, d)),
                     ("layers.self_attn.v_proj.weight", (n, kv, d)), ("layers.self_attn.o_proj.weight", (n, d, d))]
        ffn = [("layers.mlp.gate_proj.weight", (n, h, d)), ("layers.mlp.down_proj.weight", (n, d, h)),
               ("layers.mlp.up_proj.weight", (n, h, d))]
        output = [] if self.shared_classifier else [("lm_head.weight", (self.vocab_size, d))]
        embedding = ("model.embed_tokens.weight", (self.vocab_size, d))
        if self.version == 0:
            return [embedding, ("layers.input_layernorm.weight", (n, d)), *attention,
                    ("layers.post_attention_layernorm.weight", (n, d)), *ffn, ("model.norm.weight", (d,)),
                    ("rope", (2, self.seq_len, self.d_head // 2)), *output]
        return [("layers.input_layernorm.weight", (n, d)), ("layers.post_attention_layernorm.weight", (n, d)),
                ("model.norm.weight", (d,)), embedding, *attention, *ffn, *output]

    def weight_bytes(self) -> int:
        """The bytes the header's arrays take, 4 per float32."""
        return 4 * sum(math.prod(shape) for _, shape in self.arrays())


def read_header(path: Path, data: bytes) -> Llama2cHeader:
    """The checkpoint's header, checked against the file's size.

    Args:
        path: the file, for messages.
        data: its bytes.

    Returns:
        The ``Llama2cHeader``.

    Raises:
        ModelError: the file is shorter than a header; it is version 2 (quantised) or an
            unknown version; a size is not positive, the heads do not divide the width or
            the key/value heads the heads, a head's width is odd; or the sizes do not add
            up to the file's length (the message gives both).
    """
    if len(data) < 4 * len(FIELDS):
        raise ModelError(f"{path} is {len(data)} bytes: too short for a llama2.c checkpoint's header")
    (first,) = struct.unpack_from("<I", data, 0)
    if first == MAGIC:
        if len(data) < HEADER_V1:
            raise ModelError(f"{path} starts like a llama2.c checkpoint (ak42) but is {len(data)} bytes, "
                             f"shorter than its {HEADER_V1}-byte header")
        (version,) = struct.unpack_from("<i", data, 4)
        if version == 2:
            raise ModelError(f"{path} is llama2.c's version 2, int8-quantised (Q8_0): selfattn reads the float32 "
                             f"versions 0 and 1 (export it again with llama2.c's export.py --version 1)")
        if version != 1:
            raise ModelError(f"{path} is llama2.c format version {version}: selfattn reads versions 0 and 1")
        sizes = struct.unpack_from("<7i", data, 8)
        shared, offset = data[36] != 0, HEADER_V1
    else:
        version, sizes, offset = 0, list(struct.unpack_from("<7i", data, 0)), 4 * len(FIELDS)
        shared = sizes[5] > 0  # legacy: a negative vocab_size means the output matrix follows
        sizes[5] = abs(sizes[5])
    values = dict(zip(FIELDS, sizes))
    for name, value in values.items():
        if value <= 0:
            raise ModelError(f"{path}: the header's {name} is {value}; a llama2.c checkpoint's sizes are positive "
                             f"(is this a llama2.c .bin file?)")
    if values["dim"] % values["n_heads"] or values["n_heads"] % values["n_kv_heads"]:
        raise ModelError(f"{path}: the header's dim {values['dim']}, n_heads {values['n_heads']} and n_kv_heads "
                         f"{values['n_kv_heads']} do not divide (is this a llama2.c .bin file?)")
    header = Llama2cHeader(version, **values, shared_classifier=shared, offset=offset)
    if header.d_head % 2:
        raise ModelError(f"{path}: a head is {header.d_head} wide; RoPE needs an even width")
    expected = offset + header.weight_bytes()
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "longer than its header says"
        raise ModelError(
            f"{path} is {what}: its version {version} header ({', '.join(f'{k} {v}' for k, v in values.items())}) "
            f"adds up to {expected} bytes, the file has {len(data)}"
        )
    return header


def read_checkpoint(path: str | os.PathLike) -> tuple[Llama2cHeader, dict[str, torch.Tensor]]:
    """A llama2.c checkpoint's header and its tensors under Llama's tensor names.

    Args:
        path: the .bin file.

    Returns:
        (header, tensors): tensors are float32, named as a transformers Llama checkpoint
            names them (``model.layers.{i}.self_attn.q_proj.weight`` ...), with wq and wk
            as stored (RoPE's interleaved pairs: not permuted).

    Raises:
        ModelError: the file cannot be read, or its header is refused (``read_header``).
    """
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ModelError(f"cannot read {path}: {error.strerror or error}") from None
    header = read_header(path, data)
    flat = torch.frombuffer(bytearray(data[header.offset:]), dtype=torch.float32)  # little-endian floats
    tensors, start = {}, 0
    for name, shape in header.arrays():
        count = math.prod(shape)
        block = flat[start:start + count].view(shape)
        start += count
        if name == "rope":
            continue  # version 0's saved RoPE tables: we compute the rotation ourselves
        if name.startswith("layers."):
            for layer in range(header.n_layers):
                tensors[f"model.layers.{layer}.{name[len('layers.'):]}"] = block[layer]
        else:
            tensors[name] = block
    return header, tensors


def config_of(header: Llama2cHeader) -> DecoderConfig:
    """The ``DecoderConfig`` of a llama2.c model: a Llama with interleaved RoPE, eps 1e-5, BOS = 1.

    Args:
        header: the checkpoint's header.

    Returns:
        Its config: flash attention for long inputs (as ``load_pretrained`` chooses),
            generation stopping at BOS as llama2.c's sampler does.
    """
    return DecoderConfig(
        model_type=LLAMA,
        vocab_size=header.vocab_size,
        d_model=header.dim,
        n_layers=header.n_layers,
        n_heads=header.n_heads,
        n_kv_heads=header.n_kv_heads,
        d_head=header.d_head,
        d_ff=header.hidden_dim,
        activation="swiglu",
        norm="rms",
        norm_eps=NORM_EPS,
        positional="rope",
        max_positions=header.seq_len,
        rope_base=ROPE_BASE,
        rope_pairs="interleaved",
        tie_embeddings=header.shared_classifier,
        bos_id=BOS,
        eos_ids=(BOS,),
        pad_id=UNK,
        attn_impl="flash",
    )


def find_tokenizer(checkpoint: Path) -> Path:
    """The tokenizer beside a checkpoint: ``tokenizer.bin``, else the one ``tok*.bin``.

    Raises:
        ModelError: none is there, or several ``tok*.bin`` are and none is tokenizer.bin
            (the message says how to name one).
    """
    folder = checkpoint.parent
    if (folder / "tokenizer.bin").is_file():
        return folder / "tokenizer.bin"
    found = sorted(p for p in folder.glob("tok*.bin") if p.is_file() and p != checkpoint)
    if len(found) == 1:
        return found[0]
    if not found:
        raise ModelError(f"no llama2.c tokenizer beside {checkpoint} (tokenizer.bin or tok*.bin): "
                         f"name it with tokenizer= (Python) or --tokenizer FILE")
    raise ModelError(f"{len(found)} tokenizers beside {checkpoint} ({', '.join(p.name for p in found)}): "
                     f"name one with tokenizer= (Python) or --tokenizer FILE")


def load_llama2c(path: str | os.PathLike, tokenizer: str | os.PathLike | None = None, name: str | None = None) -> DecoderModel:
    """A llama2.c checkpoint as our ``DecoderModel``, frozen and in eval mode.

    Args:
        path: the checkpoint (.bin, version 0 or 1).
        tokenizer: its llama2.c tokenizer file; None: the one beside it (``find_tokenizer``).
        name: what outputs call the model; None: the file's name without its extension.

    Returns:
        The model with its ``Llama2cTokenizer`` (padding on the left).

    Raises:
        ModelError: the checkpoint or the tokenizer is refused (one line saying why), or the
            tokenizer's vocabulary is not the checkpoint's.
    """
    path = Path(path).expanduser()
    header, tensors = read_checkpoint(path)
    config = config_of(header)
    tokenizer_path = find_tokenizer(path) if tokenizer is None else Path(tokenizer).expanduser()
    if not tokenizer_path.is_file():
        raise ModelError(f"the tokenizer {tokenizer_path} is not a file")
    vocab = Llama2cTokenizer(tokenizer_path, config.max_positions, config.pad_id, padding_side="left",
                             vocab_size=config.vocab_size)
    model = DecoderModel(config, vocab, name or path.stem)
    rules, ignored = weight_table(config, tensors.keys())
    copy_weights(model, tensors, rules, ignored, f"llama2.c ({path.name})")
    return model.eval().requires_grad_(False)
