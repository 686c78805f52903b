"""GGUF files against transformers' own GGUF loading (``from_pretrained(folder, gguf_file=...)``).

Tiny files written in the tests with gguf's writer (``tiny_gguf.py``) for each GGUF
architecture a family runs (llama, with llama.cpp's reordered q and k rows; qwen2 with q,
k, v biases; qwen3 with q and k norms and a head width other than width / heads), their
tensors in float32, Q8_0 and Q6_K; gemma3 with its norms stored as 1 + w, sandwich norms,
sliding and full layers: logits, hidden states and attention weights on a
left-padded batch, and greedy generation. Then every way a file can be wrong, as one line.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import selfattn as sa
from selfattn.errors import ModelError
from selfattn.positional.rope_scaling import Llama3RopeScaling, rope_frequencies
from tiny_gguf import gguf, llama3_divisors, write_gguf

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' GGUF loading needs it

ARCHITECTURES = {
    "llama": dict(),
    "qwen2": dict(tied=True),
    "qwen3": dict(heads=4, kv_heads=2, d_head=128),  # transformers reads a qwen3 file's head width as 128
    # six layers: five slide (window 4), the sixth is full with its own RoPE base; transformers scales
    # gemma3's scores by 1 / sqrt(256) whatever the file says, so the head width is 256
    "gemma3": dict(layers=6, heads=2, kv_heads=1, d_head=256, tied=True, rope_base=1e6),
}
FAMILY = {"gemma3": "gemma3_text"}  # the GGUF architecture -> our family, where the names differ
IDS = torch.tensor([[5, 70, 200, 33, 90, 12, 260, 261, 1, 2, 44, 45], [0, 0, 0, 0, 4, 5, 6, 7, 8, 9, 10, 11]])
MASK = torch.tensor([[1] * 12, [0] * 4 + [1] * 8])


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def pair(request, tmp_path_factory):
    """(architecture, our model, transformers' model) from one tiny file."""
    folder = tmp_path_factory.mktemp(request.param)
    path = write_gguf(folder / "tiny.gguf", request.param, **ARCHITECTURES[request.param])
    ours = sa.load_pretrained(path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file="tiny.gguf", attn_implementation="eager", dtype=torch.float32).eval()
    return request.param, ours, theirs


def test_logits_hidden_states_and_weights_match_transformers(pair):
    _, ours, theirs = pair
    with torch.no_grad():
        a = ours(IDS, attention_mask=MASK, output_attentions=True, output_hidden_states=True)
        b = theirs(IDS, attention_mask=MASK, output_attentions=True, output_hidden_states=True)
    real = MASK.bool()
    torch.testing.assert_close(a.logits[real], b.logits[real], atol=1e-4, rtol=1e-4)
    for x, y in zip(a.hidden_states, b.hidden_states, strict=True):
        torch.testing.assert_close(x[real], y[real], atol=1e-4, rtol=1e-4)
    for x, y in zip(a.attentions, b.attentions, strict=True):
        torch.testing.assert_close(x * real[:, None, :, None], y * real[:, None, :, None], atol=1e-5, rtol=0)
    assert float(a.attentions[-1][0].amax(-1).mean()) > 0.5  # far from uniform: scale and mask errors would show


def test_greedy_generation_matches_transformers(pair):
    _, ours, theirs = pair
    prompt = [5, 70, 200, 33, 90]
    got = ours.generate([prompt], max_new_tokens=20).ids[0]
    want = theirs.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(prompt):].tolist()
    assert got == want[: len(got)] and len(got) >= 1


def test_the_block_types_and_family_are_said(pair):
    architecture, ours, _ = pair
    layers = ARCHITECTURES[architecture].get("layers", 2)
    assert ours.gguf_types["Q8_0"] == layers * 4 and ours.gguf_types["Q6_K"] == 1 and ours.gguf_types["F32"] > 0
    assert ours.config.model_type == FAMILY.get(architecture, architecture) and ours.name == "tiny"


def test_bfloat16_halves_the_weights(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", "llama")
    full, half = sa.load_pretrained(path), sa.load_pretrained(path, dtype="bfloat16")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    size = lambda m: sum(p.numel() * p.element_size() for p in m.parameters())  # noqa: E731
    assert size(half) * 2 == size(full)
    for a, b in zip(full.parameters(), half.parameters()):
        torch.testing.assert_close(a.to(torch.bfloat16), b, atol=0, rtol=0)


def _refusal(call) -> str:
    """The ModelError message ``call()`` raises (the test fails if it raises none)."""
    with pytest.raises(ModelError) as caught:
        call()
    return str(caught.value)


def test_a_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_bytes(b"PK\x03\x04 a zip file, say")
    message = _refusal(lambda: sa.load_pretrained(path))
    assert message == f"{path} is not a GGUF file (it does not start with the bytes GGUF)"


def test_a_truncated_file(tmp_path):
    whole = write_gguf(tmp_path / "whole.gguf", "llama").read_bytes()
    for cut in (len(whole) // 2, 200, 30):  # in the tensors, in the metadata, in the header
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(whole[:cut])
        message = _refusal(lambda: sa.load_pretrained(path))
        assert message.startswith(f"cannot read {path} as GGUF (truncated or damaged?): ") and "\n" not in message


def test_an_architecture_no_family_runs(tmp_path):
    path = tmp_path / "falcon.gguf"
    writer = gguf.GGUFWriter(str(path), "falcon")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    message = _refusal(lambda: sa.load_pretrained(path))
    assert message == f"{path} holds a 'falcon' model: selfattn runs GGUF architectures gemma3, llama, qwen2 or qwen3"


def test_a_block_type_gguf_cannot_dequantize(tmp_path):
    path = write_gguf(tmp_path / "f64.gguf", "llama", final_norm_dtype=np.float64)
    assert gguf.GGUFReader(str(path)).tensors[-2].tensor_type.name == "F64"  # output_norm, before output
    message = _refusal(lambda: sa.load_pretrained(path))
    assert f"{path}: cannot dequantize output_norm.weight, block type F64: " in message and "\n" not in message


def _ollama_store(root, blob: bytes, name: str = "tiny", tag: str = "latest"):
    """An ollama store in ``root`` holding ``blob`` as the model layer of library/NAME:TAG."""
    import hashlib
    import json

    digest = hashlib.sha256(blob).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(blob)
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 1},
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(blob)}]}))
    return root


def test_an_ollama_model_is_its_gguf_blob(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "tiny.gguf", "qwen2")
    monkeypatch.setenv("OLLAMA_MODELS", str(_ollama_store(tmp_path / "store", path.read_bytes())))
    direct, stored = sa.load_pretrained(path), sa.load_pretrained("ollama:tiny:latest")
    assert stored.name == "tiny:latest" and stored.gguf_types == direct.gguf_types
    with torch.no_grad():
        torch.testing.assert_close(stored(IDS[:1]).logits, direct(IDS[:1]).logits, atol=0, rtol=0)


def test_the_command_line_runs_an_ollama_model_and_refuses_a_missing_tag(tmp_path, monkeypatch, capsys):
    from selfattn.cli import main

    path = write_gguf(tmp_path / "tiny.gguf", "llama")
    monkeypatch.setenv("OLLAMA_MODELS", str(_ollama_store(tmp_path / "store", path.read_bytes())))
    assert main(["generate", "the cat", "--model", "ollama:tiny", "--max-new-tokens", "5", "--format", "json"]) == 0
    record = __import__("json").loads(capsys.readouterr().out)
    assert record["model"] == "tiny" and len(record["ids"]) == 5
    assert record["ids"] == sa.load_pretrained(path).generate("the cat", max_new_tokens=5).ids[0]
    assert main(["generate", "the cat", "--model", "ollama:tiny:q4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ollama has tiny:latest" in err
    assert main(["generate", "the cat", "--model", "ollama:tiny", "--tokenizer", str(path)]) == 2
    assert capsys.readouterr().err.endswith("ollama:tiny uses the tokenizer inside its GGUF file\n")


def test_the_live_app_lists_a_gguf_models_block_types_before_and_after_it_loads(tmp_path):
    from selfattn.commands.live import LiveModels

    path = write_gguf(tmp_path / "tiny.gguf", "llama")
    want = {"F32": 12, "Q8_0": 8, "Q6_K": 1}
    for loaded_first in (False, True):
        models = LiveModels([str(path)])
        if loaded_first:
            models.model(str(path))  # its outline then comes from the loaded model
        entry = next(e for e in models.listing()["models"] if e["name"] == str(path))
        assert entry["weights"] == want and entry["loaded"] is loaded_first, entry


# --- Llama 3.1 / 3.2: RoPE rescaled by the rope_freqs tensor -------------------------------------
# llama.cpp's converter writes Llama 3's "llama3" scaling as one divisor per RoPE pair (the tensor
# rope_freqs) and no metadata key. transformers' GGUF loading drops that tensor and runs the file
# unscaled, so the reference is transformers' own Llama with the same weights and config.json's
# llama3 rope_parameters: its computation of the scaled frequencies, not ours.

# Llama 3.1's factors; its original context 8192 shrunk to 64 so that 90 positions cross it.
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
LONG = torch.randint(0, 266, (1, 90), generator=torch.Generator().manual_seed(3))


def _divisors(d_head: int, base: float, s: dict) -> np.ndarray:
    return llama3_divisors(d_head, base, s["factor"], s["low_freq_factor"], s["high_freq_factor"],
                           s["original_max_position_embeddings"])


@pytest.fixture(scope="module")
def llama3_models(tmp_path_factory):
    """(our model, the reference with llama3 scaling, transformers' GGUF model without it) from one file."""
    folder = tmp_path_factory.mktemp("llama3")
    write_gguf(folder / "tiny.gguf", "llama", rope_freqs=_divisors(64, 10000.0, LLAMA3))
    ours = sa.load_pretrained(folder / "tiny.gguf")
    unscaled = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file="tiny.gguf", attn_implementation="eager", dtype=torch.float32).eval()
    config = dict(unscaled.config.to_dict(), rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, **LLAMA3})
    reference = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
    reference.load_state_dict(unscaled.state_dict())
    return ours, reference, unscaled


def test_rope_freqs_give_the_logits_of_llama3_scaling(llama3_models):
    ours, reference, unscaled = llama3_models
    assert ours.config.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 64)
    real = MASK.bool()
    with torch.no_grad():
        torch.testing.assert_close(ours(LONG).logits, reference(LONG).logits, atol=1e-4, rtol=1e-4)
        got, want = ours(IDS, attention_mask=MASK).logits, reference(IDS, attention_mask=MASK).logits
        torch.testing.assert_close(got[real], want[real], atol=1e-4, rtol=1e-4)  # left-padded
        # where the scaling matters: without it every position from the 16th on is off by more than 0.1
        assert float((reference(LONG).logits - unscaled(LONG).logits)[0, 16:].abs().amax(-1).min()) > 0.1


def test_rope_freqs_greedy_generation_matches_llama3_scaling(llama3_models):
    ours, reference, _ = llama3_models
    prompt = LONG[0, :40].tolist()
    got = ours.generate([prompt], max_new_tokens=20).ids[0]
    want = reference.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()
    assert got == want[: len(got)] and len(got) >= 1


@pytest.mark.parametrize("d_head, factor", [(128, 8.0), (64, 32.0)])  # Llama 3.1 8B; Llama 3.2 1B
def test_real_llama3_rope_freqs_read_back_as_metas_settings(tmp_path, d_head, factor):
    meta = {"factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    divisors = _divisors(d_head, 500000.0, meta)
    path = write_gguf(tmp_path / "tiny.gguf", "llama", heads=256 // d_head, kv_heads=1, rope_base=500000.0,
                      rope_freqs=divisors)
    scaling = sa.load_pretrained(path).config.rope_scaling
    assert scaling == Llama3RopeScaling(factor, 1.0, 4.0, 8192)
    theta = rope_frequencies(d_head, 500000.0)
    torch.testing.assert_close(rope_frequencies(d_head, 500000.0, scaling), theta / torch.from_numpy(divisors).double(),
                               atol=0, rtol=1e-6)


def test_rope_freqs_of_ones_is_plain_rope(tmp_path):
    plain = sa.load_pretrained(write_gguf(tmp_path / "plain.gguf", "llama"))
    ones = sa.load_pretrained(write_gguf(tmp_path / "ones.gguf", "llama", rope_freqs=np.ones(32, np.float32)))
    assert ones.config.rope_scaling is None
    with torch.no_grad():
        torch.testing.assert_close(ones(IDS[:1]).logits, plain(IDS[:1]).logits, atol=0, rtol=0)


def test_rope_freqs_that_do_not_fit_are_one_line(tmp_path, capsys):
    from selfattn.cli import main

    short = write_gguf(tmp_path / "short.gguf", "llama", rope_freqs=_divisors(32, 10000.0, LLAMA3))
    message = _refusal(lambda: sa.load_pretrained(short))
    assert message == f"{short}: tensor rope_freqs.weight: 16 frequency divisors for the 32 pairs of a 64-wide head"
    assert main(["generate", "the cat", "--model", str(short)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("16 frequency divisors for the 32 pairs of a 64-wide head\n")
    ramp = write_gguf(tmp_path / "ramp.gguf", "llama", rope_freqs=np.linspace(1, 3, 32, dtype=np.float32))
    message = _refusal(lambda: sa.load_pretrained(ramp))
    assert message == f"{ramp}: tensor rope_freqs.weight: the frequency divisors are not those of a llama3 scaling"


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_a_linear_or_yarn_scaling_key_is_refused(tmp_path, kind):
    path = write_gguf(tmp_path / f"{kind}.gguf", "llama", rope_scaling=(kind, 4.0))
    assert _refusal(lambda: sa.load_pretrained(path)) == (
        f"{path}: llama.rope.scaling.type is {kind!r}: selfattn runs a llama file's RoPE unscaled, "
        "or rescaled by its rope_freqs tensor (Llama 3.1 / 3.2)")
    unit = sa.load_pretrained(write_gguf(tmp_path / "unit.gguf", "llama", rope_scaling=("linear", 1.0)))
    assert unit.config.rope_scaling is None  # a linear factor of 1 changes nothing
