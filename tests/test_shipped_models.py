"""The two trained models that ship (tiny-induction, tiny-shakespeare): they load, match
transformers, behave as trained, and every command takes their names."""

from __future__ import annotations

import json

import pytest
import torch

import selfattn as sa
from selfattn.models.files import model_folder

SHIPPED = ("tiny-induction", "tiny-shakespeare")


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_folder_is_small_and_loads_into_transformers_too(name):
    transformers = pytest.importorskip("transformers")
    folder = model_folder(name)
    assert sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) < 5_000_000
    ours = sa.load_pretrained(name)
    assert (ours.name, ours.training) == (name, False)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = torch.tensor([ours.tokenizer.encode(["abcdefgabcdefg"]).input_ids[0].tolist()])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, atol=1e-4, rtol=1e-4)
    settings = json.loads((folder / "training.json").read_text())
    assert settings["finished"] and settings["step"] == settings["config"]["steps"]
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["step"] == settings["step"]


def test_tiny_induction_continues_a_repeat_it_has_never_seen():
    model = sa.load_pretrained("tiny-induction")
    # Random symbols, then the first three again: an induction head completes the rest.
    out = model.generate("qLxdTbemRkqLx", max_new_tokens=7)
    assert out.text[0] == "dTbemRk"


def test_tiny_induction_has_its_induction_heads_in_layer_1():
    final = json.loads((model_folder("tiny-induction") / "metrics.jsonl").read_text().splitlines()[-1])
    best = max(final["heads"], key=lambda h: h["induction"])
    assert best["layer"] == 1 and best["induction"] > 0.4
    assert all(h["induction"] < 0.1 for h in final["heads"] if h["layer"] == 0)
    assert final["probe_loss"]["second_copy"] < 0.25 * final["probe_loss"]["first_copy"]


def test_tiny_shakespeare_predicts_shakespeare_better_than_chance():
    model = sa.load_pretrained("tiny-shakespeare")
    text = "ROMEO. But soft, what light through yonder window breaks?"
    ids = model.tokenizer.encode([text]).input_ids
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
    assert float(loss) < 2.5 < torch.log(torch.tensor(float(model.config.vocab_size)))  # chance: ln 85 = 4.44


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("argv", [
    ["explain", "abcabc", "--layer", "1", "--head", "0", "--query", "4"],
    ["heads", "abcabc"],
    ["compare", "abcabc", "abcabd", "--query", "5"],
    ["generate", "abcab", "--max-new-tokens", "3"],
])
def test_every_command_takes_the_name(run_cli, name, argv):
    status, out, err = run_cli(*argv, "--model", name)
    assert (status, err) == (0, ""), err
    assert out


@pytest.mark.parametrize("name", SHIPPED)
def test_plot_and_view_take_the_name(run_cli, tmp_path, name):
    for argv in (["plot", "abcabc", "--kind", "heatmap", "-o", str(tmp_path / "p.png")],
                 ["view", "abcabc", "-o", str(tmp_path / "v.html")]):
        status, _, err = run_cli(*argv, "--model", name)
        assert (status, err) == (0, ""), err
    status, _, err = run_cli("plot", "--training", name, "--kind", "training", "-o", str(tmp_path / "t.png"))
    assert (status, err) == (0, ""), err
    assert (tmp_path / "t.png").stat().st_size > 10_000
