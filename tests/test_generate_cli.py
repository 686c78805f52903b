"""`selfattn generate`: the text and JSON against transformers' own greedy generate; bad input is one line."""

from __future__ import annotations

import io
import json

import pytest
import torch

from selfattn.models.registry import family_names

from tiny_models import reference_model, reference_tokenizer, tiny_checkpoint

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    return {family: tiny_checkpoint(family, root / family) for family in ("gpt2", "llama", "bert")}


def _transformers_greedy(folder, prompt: str, n: int) -> list[int]:
    reference, tokenizer = reference_model(folder), reference_tokenizer(folder)
    encoded = tokenizer([prompt], return_tensors="pt")
    with torch.no_grad():
        out = reference.generate(**encoded, max_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    new = out[0, encoded["input_ids"].shape[1]:].tolist()
    eos = reference.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    return next((new[: i + 1] for i, t in enumerate(new) if t in eos), new)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_json_holds_the_greedy_ids_of_transformers(run_cli, folders, family):
    status, out, err = run_cli("generate", "The cat sat", "--model", str(folders[family]), "--max-new-tokens", "12",
                               "--format", "json")
    assert status == 0 and err == ""
    data = json.loads(out)
    expected = _transformers_greedy(folders[family], "The cat sat", 12)
    assert data["ids"] == expected
    tokenizer = reference_tokenizer(folders[family])
    assert data["prompt"] == "The cat sat"
    assert data["prompt_ids"] == tokenizer("The cat sat")["input_ids"]
    assert data["tokens"] == tokenizer.convert_ids_to_tokens(expected)
    assert data["text"] == tokenizer.decode(expected, skip_special_tokens=True)
    assert len(data["top"]) == len(expected)
    for step, chosen in zip(data["top"], expected):
        probabilities = [c["probability"] for c in step]
        assert len(step) == 5 and probabilities == sorted(probabilities, reverse=True) and sum(probabilities) <= 1 + 1e-9
        assert step[0]["id"] == chosen  # greedy: the most likely token


def test_text_is_the_prompt_and_its_continuation(run_cli, folders):
    status, out, err = run_cli("generate", "The cat", "--model", str(folders["llama"]), "--max-new-tokens", "6")
    assert status == 0 and err == ""
    expected = reference_tokenizer(folders["llama"]).decode(_transformers_greedy(folders["llama"], "The cat", 6),
                                                            skip_special_tokens=True)
    assert out == "The cat" + expected + "\n"


def test_a_terminal_sees_the_text_as_it_is_made(folders):
    from selfattn.commands.generate import generate_command

    class Terminal(io.StringIO):
        writes = 0

        def isatty(self):
            return True

        def write(self, text):
            Terminal.writes += 1
            return super().write(text)

    terminal = Terminal()
    generate_command("The cat", str(folders["gpt2"]), 8, 0.0, None, None, None, "text", terminal)
    assert Terminal.writes > 3  # the prompt, then piece by piece
    piped = io.StringIO()
    generate_command("The cat", str(folders["gpt2"]), 8, 0.0, None, None, None, "text", piped)
    assert terminal.getvalue() == piped.getvalue()


def test_sampling_follows_the_seed(run_cli, folders):
    args = ("generate", "The cat", "--model", str(folders["llama"]), "--temperature", "0.9", "--top-k", "40",
            "--top-p", "0.95", "--format", "json")
    first = json.loads(run_cli(*args, "--seed", "7")[1])
    again = json.loads(run_cli(*args, "--seed", "7")[1])
    assert first["ids"] == again["ids"] and first["settings"]["seed"] == 7 and not first["settings"]["greedy"]


def _broken(folders, tmp_path, what: str):
    target = tmp_path / what
    target.mkdir()
    for item in folders["llama"].iterdir():
        (target / item.name).write_bytes(item.read_bytes())
    if what == "no-config":
        (target / "config.json").unlink()
    elif what == "other-type":
        config = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**config, "model_type": "falcon"}))
    elif what == "missing-tensor":
        from safetensors.torch import load_file, save_file

        state = load_file(target / "model.safetensors")
        del state["model.norm.weight"]
        save_file(state, target / "model.safetensors")
    return str(target)


@pytest.mark.parametrize(
    "argv, message",
    [
        (lambda f, t: ["--model", _broken(f, t, "no-config")], "no config.json"),
        (lambda f, t: ["--model", _broken(f, t, "other-type")], ", ".join(family_names())),
        (lambda f, t: ["--model", _broken(f, t, "missing-tensor")], "model.norm.weight"),
        (lambda f, t: ["--model", "someone/absent-model"], "models--someone--absent-model"),
        (lambda f, t: ["--model", str(f["bert"])], "encoder"),
        (lambda f, t: ["--model", str(f["llama"]), "--max-new-tokens", "0"], "max_new_tokens"),
        (lambda f, t: ["--model", str(f["llama"]), "--max-new-tokens", "10001"], "from 1 to 10000"),
        (lambda f, t: ["--model", str(f["llama"]), "--temperature", "-1"], "temperature"),
        (lambda f, t: ["--model", str(f["llama"]), "--top-p", "2"], "top_p"),
        (lambda f, t: ["--model", str(f["llama"]), "--top-k", "0"], "top_k"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(run_cli, folders, tmp_path, monkeypatch, argv, message):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    status, out, err = run_cli("generate", "The cat", *argv(folders, tmp_path))
    assert status == 2 and out == ""
    assert err.startswith("selfattn: error: ") and err.count("\n") == 1 and message in err


def test_a_prompt_longer_than_the_positions(run_cli, folders):
    status, out, err = run_cli("generate", "cat " * 80, "--model", str(folders["gpt2"]))
    assert status == 2 and out == "" and "64 positions" in err and err.count("\n") == 1


def test_help_and_an_unknown_model_name_every_decoder_and_no_encoder(run_cli, monkeypatch):
    from selfattn.models.families import family_kinds

    decoders = [name for name, kind in family_kinds().items() if kind == "decoder"]
    encoders = [name for name, kind in family_kinds().items() if kind == "encoder"]
    assert {"gpt2", "llama", "qwen3", "gemma3_text"} <= set(decoders) and encoders == ["bert"]
    monkeypatch.setenv("COLUMNS", "200")
    status, out, _ = run_cli("generate", "--help")
    assert status == 0
    described = " ".join(out.split())
    assert all(name in described for name in decoders) and "llama2.c" in described
    status, out, err = run_cli("generate", "x", "--model", "no-such-model")
    assert status == 2 and out == "" and err.count("\n") == 1
    assert all(name in err for name in decoders) and not any(name in err for name in encoders)
    assert "all-MiniLM-L6-v2" not in err and "stories260K" in err and ".bin" in err and "folder" in err
