"""``selfattn heads --ablation`` and ``--texts``, and the one rule for head labels."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

import selfattn as sa
from selfattn.analysis.decoder_roles import DECODER_THRESHOLD, role_of
from selfattn.analysis.next_token import next_token_losses, probe_positions

PATTERNS = {"previous token": "previous_token", "duplicate token": "duplicate_token", "first token": "first_token"}
TEXTS = ["Lily had a red ball. Lily liked the ball.", "Tom saw a big dog. The dog was happy.",
         "One day, Sue went to the park with her mom."]


def heads_json(run_cli, *argv):
    status, out, err = run_cli("heads", *argv, "--format", "json")
    assert status == 0, err
    return json.loads(out)


@pytest.mark.parametrize("length", [20, 31])
def test_on_the_probe_the_role_is_read_from_the_numbers_the_table_shows(run_cli, length):
    data = heads_json(run_cli, "--model", "tiny-induction", "--probe", "induction", "--probe-length", str(length))
    for h in data["heads"]:
        shown = {name: h["scores"][key] for name, key in PATTERNS.items()} | {"induction": h["probe_induction"]}
        best = max(shown, key=shown.get)
        assert h["role"] == (best if shown[best] >= DECODER_THRESHOLD else "mixed")
    induction = [(h["layer"], h["head"]) for h in data["heads"] if h["role"] == "induction"]
    assert induction == [(1, 0), (1, 1), (1, 2), (1, 3)]  # every head whose probe score passes 0.4


def test_train_summary_and_shipped_readme_use_the_same_rule():
    from selfattn.models.files import model_folder
    from selfattn.training.records import heads_by_role

    folder = model_folder("tiny-induction")
    final = json.loads((folder / "metrics.jsonl").read_text().splitlines()[-1])
    named = heads_by_role(final["heads"])
    for h in final["heads"]:
        role = role_of({"previous token": h["previous_token"], "induction": h["induction"], "first token": h["first_token"]})
        assert (h in named.get(role, [])) == (role != "mixed")
    readme = (folder / "README.md").read_text()
    for h in named["induction"] + named["previous token"]:
        assert f"L{h['layer']} H{h['head']}" in readme
    assert "L0 H1" not in readme  # 0.27: not a previous-token head by the rule


def test_ablation_column_is_each_head_alone_zeroed(run_cli):
    data = heads_json(run_cli, "--model", "tiny-induction", "--probe", "induction", "--ablation")
    model = sa.load_pretrained("tiny-induction")
    ids = torch.tensor([data["probe"]["ids"]])
    where = probe_positions(20, 1)
    with torch.no_grad():
        plain = next_token_losses(model(ids).logits, ids)[0, where].mean()
        assert data["loss"] == pytest.approx(float(plain), abs=1e-5)
        for h in data["heads"]:
            with sa.ablate(model, [(h["layer"], h["head"])]):
                knocked = next_token_losses(model(ids).logits, ids)[0, where].mean()
            assert h["ablation_delta"] == pytest.approx(float(knocked - plain), abs=1e-5)


def test_texts_average_every_score_with_its_spread(run_cli, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n\n", encoding="utf-8")
    data = heads_json(run_cli, "--model", "stories260K", "--texts", str(texts), "--ablation")
    singles = [heads_json(run_cli, "--model", "stories260K", text, "--ablation") for text in TEXTS]
    assert data["texts"] == TEXTS
    for index, h in enumerate(data["heads"]):
        for key, value in h["scores"].items():
            each = [s["heads"][index]["scores"][key] for s in singles]
            assert value["mean"] == pytest.approx(statistics.mean(each), abs=1e-9)
            assert value["std"] == pytest.approx(statistics.stdev(each), abs=1e-9)
        each = [s["heads"][index]["ablation_delta"] for s in singles]
        assert h["ablation_delta"]["mean"] == pytest.approx(statistics.mean(each), abs=1e-6)
        means = {name: h["scores"][key]["mean"] for name, key in
                 {**PATTERNS, "induction": "induction"}.items()}
        assert h["role"] == role_of(means)


def test_texts_on_an_encoder(run_cli, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS), encoding="utf-8")
    data = heads_json(run_cli, "--texts", str(texts))
    singles = [heads_json(run_cli, text) for text in TEXTS]
    for index, h in enumerate(data["heads"]):
        for part, value in h["shares"].items():
            each = [s["heads"][index]["shares"][part] for s in singles]
            assert value["mean"] == pytest.approx(statistics.mean(each), abs=1e-9)
            assert value["std"] == pytest.approx(statistics.stdev(each), abs=1e-9)
    status, out, err = run_cli("heads", "--texts", str(texts))
    assert status == 0 and "±" in out


@pytest.mark.parametrize("argv, message", [
    (["--model", "tiny-induction", "--texts", "missing.txt"], "no such file"),
    (["--model", "tiny-induction", "--texts", "EMPTY"], "holds no text"),
    (["--model", "tiny-induction", "--texts", "EMPTY", "a sentence"], "give no sentence"),
    (["--model", "tiny-induction", "--texts", "EMPTY", "--probe", "induction"], "no --probe"),
    (["--ablation"], "only a decoder has"),
])
def test_bad_heads_options(run_cli, tmp_path, argv, message):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n", encoding="utf-8")
    status, out, err = run_cli("heads", *[str(empty) if a == "EMPTY" else a for a in argv])
    assert status == 2 and message in err and "Traceback" not in err


def test_a_text_too_long_for_the_model_is_named_by_its_line(run_cli, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("abcabc\n" + "ab" * 40 + "\n", encoding="utf-8")
    status, out, err = run_cli("heads", "--model", "tiny-induction", "--texts", str(texts))
    assert status == 2 and "text 2: the text has 81 tokens" in err and "Traceback" not in err
