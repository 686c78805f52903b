"""Every command that takes ``--model`` runs a GGUF file given by its path.

One tiny llama file, written with gguf's own writer (``tiny_gguf.py``): explain's numbers
for a head are transformers' attention weights from its own GGUF loading of the same file;
heads, compare, plot, view, generate, ablate and patch run on it and write what they
write for any model; the live app offers it. The numbers of every architecture are held to
transformers in test_gguf_models.py; here the path reaches every command.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from selfattn.cli import main
from tiny_gguf import write_gguf

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' GGUF loading needs it

TEXT = "the cat sat on the mat. the cat sat on"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    return write_gguf(folder / "tiny.gguf", "llama")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def test_explain_shows_transformers_weights_for_the_head(tiny):
    status, out, err = run("explain", TEXT, "--model", str(tiny), "--layer", "1", "--head", "2", "--format", "json")
    assert status == 0 and err == ""
    data = json.loads(out)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tiny.parent), gguf_file=tiny.name, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        expected = theirs(torch.tensor([data["input_ids"]]), output_attentions=True).attentions[1][0, 2]
    torch.testing.assert_close(torch.tensor(data["weights"]), expected, rtol=0, atol=1e-5)
    status, text, _ = run("explain", TEXT, "--model", str(tiny))
    assert status == 0 and "Q8_0" in text  # the walkthrough says the weights came quantized


@pytest.mark.parametrize("argv", [
    ("heads", TEXT, "--format", "json"),
    ("heads", "--probe", "induction", "--probe-length", "12"),
    ("compare", "the cat sat", "the dog sat", "--query", "sat", "--format", "json"),
    ("generate", TEXT, "--max-new-tokens", "4", "--format", "json"),
    ("ablate", TEXT, "--heads", "1.0,1.1", "--format", "json"),
], ids=lambda argv: argv[0] + ("-probe" if "--probe" in argv else ""))
def test_the_commands_that_print_run_on_the_file(tiny, argv):
    status, out, err = run(*argv, "--model", str(tiny))
    assert status == 0 and err == "", err
    assert out.strip()
    if "--format" in argv:
        assert json.loads(out)  # one JSON document


@pytest.mark.parametrize("argv, name", [
    (("plot", TEXT, "--kind", "heatmap", "--layer", "1", "--head", "3"), "heatmap.png"),
    (("view", TEXT, "--layer", "1"), "view.html"),
    (("patch", "the cat sat on the m", "the cat sat on the h", "--target", "at"), "patch.png"),
], ids=lambda value: value[0] if isinstance(value, tuple) else "")
def test_the_commands_that_write_files_run_on_the_file(tiny, tmp_path, argv, name):
    target = tmp_path / name
    status, _, err = run(*argv, "--model", str(tiny), "-o", str(target))
    assert status == 0 and err == "", err
    assert target.is_file() and target.stat().st_size > 1000
