"""llama2.c checkpoints and the built-in stories260K, against three independent references.

1. llama2.c's published output: greedy from BOS for 200 tokens, as its own tests print it.
2. A reference written here from the file format alone: numpy reads the bytes itself and
   runs run.c's forward (RMSNorm, interleaved RoPE, grouped-query attention, SwiGLU) one
   position at a time, with its own key/value lists.
3. transformers' LlamaForCausalLM given the same weights, wq and wk rows permuted per head
   from interleaved pairs to halves (the conversion llama2.c's export describes).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import selfattn as sa
from selfattn.models.files import model_folder

FOLDER = model_folder("stories260K")
CHECKPOINT = FOLDER / "stories260K.bin"
TOKENIZER = FOLDER / "tok512.bin"

# llama2.c's test_all.py: run.c's stdout for `run stories260K.bin -z tok512.bin -t 0.0 -n 200`.
PUBLISHED = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a "
    "big, red ball. She wanted to play with it, but it was too high.\nLily's mom said, \"Lily, let's go to the park.\" "
    "Lily was sad and didn't know what to do. She said, \"I want to play with your ball, but I can't find it.\"\nLily "
    "was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to do.\"\nLily didn't want "
    "to help her mom, so she"
)


@pytest.fixture(scope="module")
def model():
    return sa.load_pretrained("stories260K")


# --- reference 2: run.c's forward, from the bytes, in numpy --------------------------------


def numpy_weights(path: Path) -> tuple[dict, dict]:
    """The version-0 file read with numpy alone: sizes, then arrays in the file's order."""
    raw = path.read_bytes()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    floats = np.frombuffer(raw, dtype="<f4", offset=28)
    head = dim // heads
    kv = kv_heads * head
    shapes = [("emb", (vocab, dim)), ("att_norm", (layers, dim)), ("wq", (layers, dim, dim)), ("wk", (layers, kv, dim)),
              ("wv", (layers, kv, dim)), ("wo", (layers, dim, dim)), ("ffn_norm", (layers, dim)),
              ("w1", (layers, hidden, dim)), ("w2", (layers, dim, hidden)), ("w3", (layers, hidden, dim)),
              ("final_norm", (dim,)), ("freqs", (2, seq_len, head // 2))]
    if not shared:
        shapes.append(("out", (vocab, dim)))
    weights, at = {}, 0
    for name, shape in shapes:
        count = int(np.prod(shape))
        weights[name] = floats[at:at + count].reshape(shape)
        at += count
    assert at == floats.size, "the numpy reader must use every float of the file"
    weights.setdefault("out", weights["emb"])
    sizes = dict(dim=dim, layers=layers, heads=heads, kv_heads=kv_heads, head=head, vocab=vocab, seq_len=seq_len)
    return sizes, weights


def run_c_greedy(path: Path, steps: int) -> list[int]:
    """Greedy tokens from BOS, one position at a time, as run.c computes them (float32)."""
    s, w = numpy_weights(path)
    group = s["heads"] // s["kv_heads"]
    keys = [[] for _ in range(s["layers"])]
    values = [[] for _ in range(s["layers"])]

    def rmsnorm(x, g):
        return g * (x / np.sqrt(np.mean(x * x) + np.float32(1e-5)))

    def rope(x, pos):  # x: (n heads, head): pair (2i, 2i+1) turned by pos / 10000^(2i / head)
        i = np.arange(0, s["head"], 2, dtype=np.float32)
        angle = pos * (1.0 / np.power(np.float32(10000.0), i / np.float32(s["head"])))
        c, sn = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        out = x.copy()
        out[:, 0::2] = x[:, 0::2] * c - x[:, 1::2] * sn
        out[:, 1::2] = x[:, 0::2] * sn + x[:, 1::2] * c
        return out

    token, out = 1, []
    for pos in range(steps):
        x = w["emb"][token].astype(np.float32)
        for layer in range(s["layers"]):
            h = rmsnorm(x, w["att_norm"][layer])
            q = rope((w["wq"][layer] @ h).reshape(s["heads"], s["head"]), pos)
            k = rope((w["wk"][layer] @ h).reshape(s["kv_heads"], s["head"]), pos)
            keys[layer].append(k)
            values[layer].append((w["wv"][layer] @ h).reshape(s["kv_heads"], s["head"]))
            K, V = np.stack(keys[layer]), np.stack(values[layer])  # (pos + 1, kv_heads, head)
            mixed = np.empty((s["heads"], s["head"]), dtype=np.float32)
            for hd in range(s["heads"]):
                scores = K[:, hd // group] @ q[hd] / np.sqrt(np.float32(s["head"]))
                p = np.exp(scores - scores.max())
                mixed[hd] = (p / p.sum()) @ V[:, hd // group]
            x = x + w["wo"][layer] @ mixed.reshape(-1)
            h = rmsnorm(x, w["ffn_norm"][layer])
            a, b = w["w1"][layer] @ h, w["w3"][layer] @ h
            x = x + w["w2"][layer] @ (a / (1 + np.exp(-a)) * b)
        logits = w["out"] @ rmsnorm(x, w["final_norm"])
        token = int(np.argmax(logits))
        if token == 1:
            break
        out.append(token)
    return out


def test_greedy_from_bos_is_llama2c_published_output(model):
    result = model.generate("", max_new_tokens=200)
    assert result.prompt_ids == [[1]]
    assert len(result.ids[0]) == 200
    text = result.text[0]
    assert text.startswith("Once upon a time, there was a little girl named Lily.")
    assert text == PUBLISHED


def test_greedy_from_bos_equals_a_numpy_reading_of_the_file(model):
    ours = model.generate("", max_new_tokens=200).ids[0]
    assert ours == run_c_greedy(CHECKPOINT, 200)


# --- reference 3: transformers' Llama -------------------------------------------------------


@pytest.fixture(scope="module")
def reference():
    pytest.importorskip("transformers")
    from tiny_models import llama2c_as_transformers

    return llama2c_as_transformers(CHECKPOINT)


TEXTS = ["Once upon a time, there was a cat.", "Lily and Ben went to the park to play with a big red ball!"]


def test_logits_hidden_states_and_weights_equal_transformers_llama(model, reference):
    encoded = model.tokenize(TEXTS)
    ours = model.run(encoded, output_attentions=True, output_hidden_states=True)
    with torch.no_grad():
        theirs = reference(
            input_ids=encoded.input_ids, attention_mask=encoded.attention_mask,
            position_ids=(encoded.attention_mask.cumsum(-1) - 1).clamp(min=0),
            output_attentions=True, output_hidden_states=True,
        )
    real = encoded.attention_mask.bool()  # compare real tokens only: padding rows are unused
    assert torch.allclose(ours.logits[real], theirs.logits[real], atol=1e-4)
    for mine, other in zip(ours.hidden_states, theirs.hidden_states, strict=True):
        assert torch.allclose(mine[real], other[real], atol=1e-4)
    for mine, other in zip(ours.attentions, theirs.attentions, strict=True):
        rows = real[:, None, :, None] & real[:, None, None, :]
        assert torch.allclose(mine.masked_fill(~rows, 0), other.masked_fill(~rows, 0), atol=1e-5)
    # The attention is far from uniform: a wrong scale or rotation could not hide.
    assert ours.attentions[0].max() > 0.9


def test_generation_equals_transformers_generate(model, reference):
    prompt = "Once upon a time"
    ids = model.tokenize(prompt).input_ids
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=1, pad_token_id=0)
    ours = model.generate(prompt, max_new_tokens=40).ids[0]
    assert ours == theirs[0, ids.shape[1]:].tolist()


# --- the format -----------------------------------------------------------------------------


def write_version1(path: Path, source: Path) -> None:
    """The same weights in llama2.c's version-1 layout: the 256-byte header, norms first."""
    s, w = numpy_weights(source)
    header = struct.pack("<Ii7iB", 0x616B3432, 1, s["dim"], w["w1"].shape[1], s["layers"], s["heads"], s["kv_heads"],
                         s["vocab"], s["seq_len"], 1)
    order = ["att_norm", "ffn_norm", "final_norm", "emb", "wq", "wk", "wv", "wo", "w1", "w2", "w3"]
    with path.open("wb") as file:
        file.write(header + b"\0" * (256 - len(header)))
        for name in order:
            file.write(np.ascontiguousarray(w[name], dtype="<f4").tobytes())


def test_version_1_from_the_same_weights_loads_to_the_same_model(model, tmp_path):
    write_version1(tmp_path / "v1.bin", CHECKPOINT)
    (tmp_path / "tok512.bin").write_bytes(TOKENIZER.read_bytes())
    again = sa.load_pretrained(tmp_path / "v1.bin")
    assert again.name == "v1"
    for (name, mine), (other_name, other) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert name == other_name and torch.equal(mine, other), name
    assert again.generate("Once", max_new_tokens=20).ids == model.generate("Once", max_new_tokens=20).ids


def test_a_checkpoint_file_loads_with_its_tokenizer_found_or_named(tmp_path):
    (tmp_path / "story.bin").write_bytes(CHECKPOINT.read_bytes())
    with pytest.raises(sa.ModelError, match=r"no llama2.c tokenizer beside .*--tokenizer FILE"):
        sa.load_pretrained(tmp_path / "story.bin")
    named = sa.load_pretrained(tmp_path / "story.bin", tokenizer=TOKENIZER)
    (tmp_path / "tokenizer.bin").write_bytes(TOKENIZER.read_bytes())
    (tmp_path / "tok999.bin").write_bytes(b"")  # tokenizer.bin wins over tok*.bin
    found = sa.load_pretrained(str(tmp_path / "story.bin"))
    assert named.name == found.name == "story"
    assert found.tokenize("The cat").input_ids.tolist() == named.tokenize("The cat").input_ids.tolist()


def test_the_empty_prompt_starts_from_bos_and_bos_ends_generation(model):
    result = model.generate("", max_new_tokens=5)
    assert result.prompt_ids == [[1]]
    assert model.config.eos_ids == (1,)
    # A sampled run long enough to end a story ends on BOS, which is kept in the ids but not the text.
    sampled = model.generate("", max_new_tokens=400, temperature=1.0, seed=3)
    assert sampled.ids[0][-1] == 1 and 1 not in sampled.ids[0][:-1]
    assert "<s>" not in sampled.text[0]


def _broken(tmp_path: Path, name: str, data: bytes, tokenizer: bytes | None = None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "model.bin").write_bytes(data)
    (folder / "tok512.bin").write_bytes(TOKENIZER.read_bytes() if tokenizer is None else tokenizer)
    return folder / "model.bin"


def _v2(data: bytes) -> bytes:
    return struct.pack("<Ii7iBi", 0x616B3432, 2, *struct.unpack("<7i", data[:28]), 1, 64).ljust(256, b"\0") + data[28:]


def _tokenizer_of(size: int) -> bytes:
    """A valid llama2.c tokenizer of ``size`` entries (the first ones of tok512.bin)."""
    raw, at, count = TOKENIZER.read_bytes(), 4, 0
    while count < size:
        (length,) = struct.unpack_from("<i", raw, at + 4)
        at += 8 + length
        count += 1
    return raw[:at]


BAD = {
    "truncated": (lambda d: d[:-1000], None, r"is truncated: its version 0 header .* adds up to 1056540 bytes, the file has 1055540"),
    "header": (lambda d: struct.pack("<7i", 64, 172, 6, 8, 4, 512, 512) + d[28:], None, r"is truncated: .*n_layers 6"),
    "heads": (lambda d: struct.pack("<7i", 64, 172, 5, 8, 3, 512, 512) + d[28:], None, r"do not divide"),
    "version2": (_v2, None, r"version 2, int8-quantised"),
    "vocabulary": (lambda d: d, _tokenizer_of(300), r"300 tokens.*512"),
    "empty": (lambda d: b"", None, r"too short"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_checkpoint_is_one_line_and_exit_2_writing_nothing(run_cli, tmp_path, case):
    change, tokenizer, message = BAD[case]
    path = _broken(tmp_path, case, change(CHECKPOINT.read_bytes()), tokenizer)
    with pytest.raises(sa.ModelError, match=message):
        sa.load_pretrained(path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    status, out, err = run_cli("generate", "Once", "--model", str(path), "--max-new-tokens", "3")
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_the_shipped_model_keeps_its_licence():
    licence = (FOLDER / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "Andrej" in licence
    assert (FOLDER / "README.md").is_file()


def test_every_model_command_takes_a_checkpoint_file_and_its_tokenizer(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "story.bin").write_bytes(CHECKPOINT.read_bytes())
    (tmp_path / "vocab.bin").write_bytes(TOKENIZER.read_bytes())  # not a name found beside it
    named = ("--model", "story.bin", "--tokenizer", "vocab.bin")
    status, out, err = run_cli("generate", "Once upon a time", *named, "--max-new-tokens", "8")
    assert status == 0, err
    assert out == "Once upon a time, there was a little girl\n"
    status, out, err = run_cli("explain", *named, "Lily saw a cat. Lily", "--query", "-1", "--format", "json")
    assert status == 0, err
    assert json.loads(out)["query"]["index"] == 7
    for argv in (("heads", *named, "Once upon a time"), ("compare", *named, "The cat sat.", "The dog sat.", "--query", "-1"),
                 ("plot", "--kind", "heatmap", *named, "The cat", "-o", "p.png"), ("view", *named, "The cat", "-o", "v.html")):
        status, out, err = run_cli(*argv)
        assert status == 0 and err == "", (argv, err)
    assert (tmp_path / "p.png").stat().st_size > 0 and (tmp_path / "v.html").stat().st_size > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (("generate", "Once", "--model", "story.bin"), "no llama2.c tokenizer beside"),
        (("generate", "Once", "--model", "story.bin", "--tokenizer", "absent.bin"), "absent.bin is not a file"),
        (("generate", "Once", "--model", "story.bin", "--tokenizer", "story.bin"), "is not a llama2.c tokenizer"),
        (("explain", "--tokenizer", "vocab.bin"), "--tokenizer goes with a llama2.c checkpoint"),
        (("explain", "--model", "all-MiniLM-L6-v2", "--tokenizer", "vocab.bin"), "goes with a llama2.c checkpoint"),
    ],
)
def test_a_tokenizer_that_does_not_fit_is_one_line(run_cli, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "story.bin").write_bytes(CHECKPOINT.read_bytes())
    (tmp_path / "vocab.bin").write_bytes(TOKENIZER.read_bytes())
    status, out, err = run_cli(*argv)
    assert status == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1
    from selfattn.models import loading

    assert loading._named == {}  # the next command loads its model as before


def test_the_walkthrough_says_which_features_rope_pairs(run_cli):
    status, out, err = run_cli("explain", "--model", "stories260K", "Lily saw a cat. Lily", "--query", "-1")
    assert status == 0, err
    assert "form 4 pairs of neighbours (x1 with x2, x3 with x4, …)" in " ".join(out.split())
    status, out, err = run_cli("explain", "--model", "stories260K", "Lily saw", "--format", "json")
    assert json.loads(out)["attention"]["rope_pairs"] == "interleaved"


def test_the_walkthroughs_closing_hint_runs_as_printed(run_cli, tmp_path, monkeypatch):
    """A checkpoint file's walkthrough ends with a `selfattn heads` command naming the file as given."""
    import shlex

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.bin").write_bytes(CHECKPOINT.read_bytes())
    (tmp_path / "tok512.bin").write_bytes(TOKENIZER.read_bytes())  # found beside the checkpoint
    status, out, err = run_cli("explain", "--model", "mine.bin", "Lily saw a cat")
    assert status == 0, err
    joined = out.replace("\\\n", " ")  # a long command goes on after a backslash
    (hint,) = [line.strip() for line in joined.splitlines() if line.strip().startswith("selfattn heads")]
    argv = shlex.split(hint)[1:]
    assert argv[argv.index("--model") + 1] == "mine.bin"
    status, out, err = run_cli(*argv)
    assert status == 0 and err == "" and "Attention heads of mine" in out, err
