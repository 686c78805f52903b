"""Tiny GGUF files written with gguf's own writer (``GGUFWriter``), for the loader's tests.

A byte-level BPE tokenizer (the 256 byte symbols, a few merges, an end-of-text token) and
random weights for a Llama-shaped architecture: llama, qwen2 (biases on q, k, v), qwen3
(q and k norms) or gemma3 (q and k norms, sandwich norms, sliding windows of 4). Weights are drawn with a large spread so that attention is far from
uniform. Tensors are stored as float32, Q8_0 (gguf's own quantizer) and Q6_K (blocks built
here: gguf has no k-quant writer), so dequantizing is part of what the tests compare.
A llama file can carry Llama 3's rope_freqs tensor too (``llama3_divisors``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

gguf = __import__("pytest").importorskip("gguf")

MERGES = ["Ġ t", "h e", "Ġt he", "a t", "Ġ c", "Ġc at", "Ġ s", "Ġs at", "o n", "Ġ on"]
END = "<|endoftext|>"


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order (its bytes_to_unicode)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = 0
    symbols = {}
    for b in range(256):
        if b in keep:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int]]:
    """(tokens, token types): bytes, then the merges' results, then the end-of-text control token."""
    tokens = byte_symbols() + ["".join(m.split()) for m in MERGES] + [END]
    types = [1] * (len(tokens) - 1) + [3]  # 1 normal, 3 control
    return tokens, types


def q6_k_blocks(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q6_K data for a (rows, cols) matrix: 210 bytes per 256 values, the scale d last (float16)."""
    blocks = rng.integers(0, 256, size=(rows, cols // 256, 210), dtype=np.uint8)
    d = np.full((rows, cols // 256), 4e-4, dtype=np.float16).view(np.uint8).reshape(rows, cols // 256, 2)
    blocks[..., 208:] = d
    return blocks.reshape(rows, cols // 256 * 210)


def llama3_divisors(d_head: int, base: float, factor: float, low: float, high: float, context: int) -> np.ndarray:
    """The rope_freqs tensor llama.cpp's converter writes for a "llama3" rope_scaling, by the formula
    as it computes it (frequencies in float32, one divisor per pair, stored as float32):
    1 where the wavelength is under context / high, factor above context / low, and between them
    1 / ((1 - s) / factor + s) with s = (context / wavelength - low) / (high - low)."""
    theta = (1.0 / base ** (np.arange(0, d_head, 2, dtype=np.float32) / np.float32(d_head))).astype(np.float32)
    out = []
    for wavelength in (2 * np.pi / theta.astype(np.float64)):
        if wavelength < context / high:
            out.append(1.0)
        elif wavelength > context / low:
            out.append(factor)
        else:
            s = (context / wavelength - low) / (high - low)
            out.append(1 / ((1 - s) / factor + s))
    return np.array(out, dtype=np.float32)


def write_gguf(path: Path, architecture: str = "llama", *, d: int = 256, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, d_ff: int = 512, context: int = 96, seed: int = 0, tied: bool = False,
               rope_base: float = 10000.0, d_head: int | None = None, final_norm_dtype=np.float32,
               rope_freqs: np.ndarray | None = None, rope_scaling: tuple[str, float] | None = None) -> Path:
    """Write a tiny model of ``architecture`` to ``path``; layer 0's feed-forward down matrix is Q6_K,
    the attention matrices Q8_0, the rest float32. d_head: the head width when it is not d / heads
    (Qwen3's; transformers reads a qwen3 file's head width as 128 whatever it says). rope_freqs:
    the tensor rope_freqs.weight (float32, written first, as llama.cpp's converter does), or None.
    rope_scaling: (ARCH.rope.scaling.type, ARCH.rope.scaling.factor), as the converter writes a linear
    or YaRN scaling, or None."""
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary()
    vocab, d_head = len(tokens), d_head or d // heads
    writer = gguf.GGUFWriter(str(path), architecture)
    arch = architecture
    writer.add_uint32(f"{arch}.context_length", context)
    writer.add_uint32(f"{arch}.embedding_length", d)
    writer.add_uint32(f"{arch}.block_count", layers)
    writer.add_uint32(f"{arch}.feed_forward_length", d_ff)
    writer.add_uint32(f"{arch}.attention.head_count", heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", kv_heads)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{arch}.rope.freq_base", rope_base)
    writer.add_uint32(f"{arch}.rope.dimension_count", d_head)
    if rope_scaling is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling[0]))
        writer.add_rope_scaling_factor(rope_scaling[1])
    if arch in ("qwen3", "gemma3"):
        writer.add_uint32(f"{arch}.attention.key_length", d_head)
        writer.add_uint32(f"{arch}.attention.value_length", d_head)
    if arch == "gemma3":
        writer.add_uint32(f"{arch}.attention.sliding_window", 4)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(vocab - 1)
    writer.add_eos_token_id(vocab - 1)
    writer.add_add_bos_token(False)

    def matrix(rows: int, cols: int, spread: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * spread).astype(np.float32)

    def add(name: str, values: np.ndarray, kind: str = "f32") -> None:
        if kind == "q8_0":
            writer.add_tensor(name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, values)

    if rope_freqs is not None:
        add("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    add("token_embd.weight", matrix(vocab, d, 1.0))
    for i in range(layers):
        block = f"blk.{i}."
        add(block + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
        add(block + "attn_q.weight", matrix(heads * d_head, d, 0.15), "q8_0")
        add(block + "attn_k.weight", matrix(kv_heads * d_head, d, 0.15), "q8_0")
        add(block + "attn_v.weight", matrix(kv_heads * d_head, d, 0.1), "q8_0")
        add(block + "attn_output.weight", matrix(d, heads * d_head, 0.05), "q8_0")
        if arch == "qwen2":
            add(block + "attn_q.bias", matrix(1, heads * d_head, 0.5)[0])
            add(block + "attn_k.bias", matrix(1, kv_heads * d_head, 0.5)[0])
            add(block + "attn_v.bias", matrix(1, kv_heads * d_head, 0.1)[0])
        if arch in ("qwen3", "gemma3"):
            add(block + "attn_q_norm.weight", (1 + 0.2 * rng.standard_normal(d_head)).astype(np.float32) * 3)
            add(block + "attn_k_norm.weight", (1 + 0.2 * rng.standard_normal(d_head)).astype(np.float32) * 3)
        add(block + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
        if arch == "gemma3":  # the sandwich: norms after attention and after the feed-forward too
            add(block + "post_attention_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
            add(block + "post_ffw_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
        add(block + "ffn_gate.weight", matrix(d_ff, d, 0.1))
        add(block + "ffn_up.weight", matrix(d_ff, d, 0.1))
        if i == 0:
            writer.add_tensor(block + "ffn_down.weight", q6_k_blocks(d, d_ff, rng), raw_dtype=gguf.GGMLQuantizationType.Q6_K)
        else:
            add(block + "ffn_down.weight", matrix(d, d_ff, 0.05))
    add("output_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(final_norm_dtype))  # float64: F64
    if not tied:
        add("output.weight", matrix(vocab, d, 0.2))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
