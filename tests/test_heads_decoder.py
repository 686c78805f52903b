"""`selfattn heads` on decoders, checked against transformers' own attention weights.

The reference is transformers' causal LM with eager attention, loaded from the same tiny
folder and run on the same ids. From its weights the test recomputes, with plain loops,
the four patterns as TransformerLens defines them, TransformerLens's "mul" score
(sum(a * P) / sum(a) over every row), the row entropy in bits and the probe's induction
score, and compares them with the JSON. The probe's ids are checked for their structure
(BOS as the tokenizer adds it, then one random copy twice, no special tokens), not for
their values.
"""

from __future__ import annotations

import io
import json
import math
import time

import pytest
import torch
from tiny_models import reference_model, reference_tokenizer, tiny_checkpoint

pytest.importorskip("transformers")

REPEATS = "the cat sat, the cat ran"  # tokens come back: dup and induct have rows to score
NAMES = ("previous_token", "duplicate_token", "induction", "first_token")
ROLE_OF = dict(zip(NAMES, ("previous token", "duplicate token", "induction", "first token")))
THRESHOLD = 0.4
NEWER = ("qwen3", "gemma3_text")  # q/k norms, explicit head_dim; Gemma's own scale, sliding and full layers


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads_decoder")
    return {family: tiny_checkpoint(family, root / family) for family in ("gpt2", "llama", "mistral", *NEWER, "bert")}


def json_of(run_cli, *argv):
    status, out, err = run_cli("heads", *argv, "--format", "json")
    assert status == 0 and err == ""
    return json.loads(out)


# ---------------------------------------------------------------- the reference, by hand


def reference_weights(folder, ids: list[int]) -> list[list[list[list[float]]]]:
    """transformers' eager attention on ``ids``: [layer][head][query][key] as float64 lists."""
    model = reference_model(folder)
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    return [layer[0].double().tolist() for layer in out.attentions]


def patterns(ids: list[int]) -> dict[str, list[list[int]]]:
    """TransformerLens's detection patterns, written out: P[i][j] = 1 where the role looks."""
    n = len(ids)
    return {
        "previous_token": [[int(j == i - 1) for j in range(n)] for i in range(n)],
        "duplicate_token": [[int(j < i and ids[j] == ids[i]) for j in range(n)] for i in range(n)],
        "induction": [[int(1 <= j <= i and ids[j - 1] == ids[i]) for j in range(n)] for i in range(n)],
        "first_token": [[int(j == 0) for j in range(n)] for i in range(n)],
    }


def mul_score(a, p) -> float:
    """TransformerLens's detect_head "mul": sum over every row and key of a * P, over the sum of a."""
    on = sum(a[i][j] * p[i][j] for i in range(len(a)) for j in range(len(a)))
    return on / sum(sum(row) for row in a)


def entropy_bits(a) -> float:
    """-sum_j a_ij log2 a_ij, averaged over the rows i >= 1."""
    rows = [-sum(x * math.log2(x) for x in row if x > 0) for row in a[1:]]
    return sum(rows) / len(rows)


def probe_score(a, length: int, offset: int) -> float:
    """The mean weight from each token t of the second copy to t - length + 1, after its first copy."""
    second = range(offset + length, offset + 2 * length)
    return sum(a[t][t - length + 1] for t in second) / length


def check_heads(data, folder):
    """Every head's scores, entropy and role in ``data`` against the reference on data's own ids."""
    ids = data["ids"]
    weights = reference_weights(folder, ids)
    p = patterns(ids)
    assert [(h["layer"], h["head"]) for h in data["heads"]] == [(l, h) for l in range(2) for h in range(4)]
    for record in data["heads"]:
        a = weights[record["layer"]][record["head"]]
        expected = {name: mul_score(a, p[name]) for name in NAMES}
        assert list(record["scores"]) == list(NAMES)
        for name in NAMES:
            assert record["scores"][name] == pytest.approx(expected[name], abs=1e-5)
            assert 0.0 <= record["scores"][name] <= 1.0
        assert record["entropy"] == pytest.approx(entropy_bits(a), abs=1e-5)
        best = max(NAMES, key=lambda name: expected[name])
        assert record["role"] == (ROLE_OF[best] if expected[best] >= THRESHOLD else "mixed")
    for name in NAMES:
        top = max(data["heads"], key=lambda h: h["scores"][name])
        assert data["strongest"][name]["score"] == top["scores"][name]
    return weights


# ---------------------------------------------------------------- a sentence


@pytest.mark.parametrize("family", ["gpt2", "llama", *NEWER])
def test_sentence_scores_match_transformers(run_cli, folders, family):
    data = json_of(run_cli, REPEATS, "--model", str(folders[family]))
    tokenizer = reference_tokenizer(folders[family])
    ids = tokenizer(REPEATS)["input_ids"]
    assert data["sentence"] == REPEATS and "probe" not in data
    assert data["ids"] == ids
    assert data["tokens"] == tokenizer.convert_ids_to_tokens(ids)
    assert data["readable"] == [tokenizer.decode([i]) for i in ids]
    assert data["threshold"] == THRESHOLD
    check_heads(data, folders[family])
    assert max(h["scores"]["duplicate_token"] for h in data["heads"]) > 0  # the repeats are seen
    assert sum(data["roles"].values()) == 8


def test_a_text_without_repeats_scores_zero_on_dup_and_induct(run_cli, folders):
    data = json_of(run_cli, "The cat", "--model", str(folders["gpt2"]))
    assert len(set(data["ids"])) == len(data["ids"])
    assert all(h["scores"]["duplicate_token"] == 0 and h["scores"]["induction"] == 0 for h in data["heads"])
    status, out, err = run_cli("heads", "The cat", "--model", str(folders["gpt2"]))
    assert status == 0 and err == ""
    assert "no token repeats" in out
    unwrapped = " ".join(out.replace("\\\n", " ").split())  # a long command is continued with a backslash
    assert f"selfattn heads --model {folders['gpt2']} --probe induction" in unwrapped


# ---------------------------------------------------------------- the probe


@pytest.mark.parametrize("family, offset", [("gpt2", 0), ("llama", 1), ("qwen3", 0), ("gemma3_text", 1)])
def test_probe_structure_and_scores_match_transformers(run_cli, folders, family, offset):
    folder = folders[family]
    tokenizer = reference_tokenizer(folder)
    assert (tokenizer("a")["input_ids"][0] == tokenizer.bos_token_id) == bool(offset)  # Llama's adds <s>, GPT-2's not
    data = json_of(run_cli, "--model", str(folder), "--probe", "induction", "--probe-length", "7", "--seed", "3")
    probe = data["probe"]
    assert (probe["kind"], probe["length"], probe["seed"]) == ("induction", 7, 3) and "sentence" not in data
    ids = probe["ids"]
    assert data["ids"] == ids and len(ids) == offset + 14
    assert ids[:offset] == [tokenizer.bos_token_id] * offset
    first, second = ids[offset: offset + 7], ids[offset + 7:]
    assert second == first and len(set(first)) == 7  # one random copy, twice, no repeat inside it
    specials = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    assert not specials & set(first)
    assert all(0 <= i < len(tokenizer) for i in first)

    weights = check_heads(data, folder)  # the four pattern scores read the whole probe
    for record in data["heads"]:
        a = weights[record["layer"]][record["head"]]
        assert record["probe_induction"] == pytest.approx(probe_score(a, 7, offset), abs=1e-5)
        # On a probe without repeats inside a copy, the induction pattern is exactly the probe's cells.
        assert record["scores"]["induction"] == pytest.approx(record["probe_induction"] * 7 / len(ids), abs=1e-5)
    top = max(data["heads"], key=lambda h: h["probe_induction"])
    assert data["strongest"]["probe_induction"] == {"layer": top["layer"], "head": top["head"],
                                                    "score": top["probe_induction"]}


def test_the_same_seed_gives_the_same_probe(run_cli, folders):
    folder = str(folders["llama"])
    one = json_of(run_cli, "--model", folder, "--probe", "induction", "--seed", "5")
    two = json_of(run_cli, "--model", folder, "--probe", "induction", "--seed", "5")
    other = json_of(run_cli, "--model", folder, "--probe", "induction", "--seed", "6")
    assert one == two
    assert one["probe"]["length"] == 20 and len(one["ids"]) == 41  # the default length, after <s>
    assert other["probe"]["ids"] != one["probe"]["ids"]
    default = json_of(run_cli, "--model", folder, "--probe", "induction")
    assert default["probe"]["seed"] == 0


def test_the_probe_never_draws_a_special_token(folders):
    """GPT-2's tokenizer adds no BOS, so its <|endoftext|> is not the first token; it must not be drawn either."""
    from selfattn.analysis.probes import induction_probe_for
    from selfattn.models.loading import shared_model

    folder = folders["gpt2"]
    specials = {i for i, token in reference_tokenizer(folder).added_tokens_decoder.items() if token.special}
    model = shared_model(str(folder))
    for seed in range(30):
        probe = induction_probe_for(model, 30, seed)  # 30 of ~320 ids, 30 times: every id is likely drawn
        assert probe.offset == 0 and not specials & set(probe.ids)


def test_a_window_shorter_than_the_probe_scores_zero_and_says_why(run_cli, folders):
    """Mistral's tiny window is 5 keys: with copies of 6 the token after a first copy is out of reach."""
    folder = str(folders["mistral"])
    fits = json_of(run_cli, "--model", folder, "--probe", "induction", "--probe-length", "5")
    check_heads(fits, folders["mistral"])
    assert max(h["probe_induction"] for h in fits["heads"]) > 0
    blind = json_of(run_cli, "--model", folder, "--probe", "induction", "--probe-length", "6")
    weights = check_heads(blind, folders["mistral"])
    offset = len(blind["ids"]) - 12
    for record in blind["heads"]:
        assert record["probe_induction"] == 0.0
        assert probe_score(weights[record["layer"]][record["head"]], 6, offset) == 0.0
    status, out, _ = run_cli("heads", "--model", folder, "--probe", "induction", "--probe-length", "6")
    assert status == 0 and "layer(s) 0, 1 see only a window" in out


def test_the_probe_names_a_planted_induction_head():
    """Weights made by hand (no training here): head (1, 2) is a perfect induction head on the probe."""
    from selfattn.analysis.probes import Probe
    from selfattn.render.text.decoder_heads import decoder_heads_document, decoder_heads_to_dict
    from selfattn.render.text.text import render_text
    from selfattn.analysis.decoder_roles import (
        classify_decoder_heads,
        induction_probe_score,
    )

    length, offset = 5, 1
    ids = [1] + [40, 41, 42, 43, 44] * 2
    n = len(ids)
    uniform = torch.tril(torch.ones(n, n, dtype=torch.float64))
    uniform = uniform / uniform.sum(dim=-1, keepdim=True)  # (n, n): row i spreads over keys 0..i
    attentions = uniform.expand(2, 4, n, n).clone()  # (layers, heads, n, n)
    planted = torch.zeros(n, n, dtype=torch.float64)
    planted[:, 0] = 1.0  # the first copy has nothing to copy: it rests on <s>
    for t in range(offset + length, n):
        planted[t] = 0.0
        planted[t, t - length + 1] = 1.0  # the token after the first copy of ids[t]
    attentions[1, 2] = planted

    probe = Probe("induction", length, 0, ids, offset)
    roles = classify_decoder_heads(attentions, ids, first_row=0)
    scores = induction_probe_score(attentions, length, offset)
    data = decoder_heads_to_dict("handmade", None, probe, ids, [str(i) for i in ids], [str(i) for i in ids], roles, scores)
    head = data["heads"][1 * 4 + 2]
    assert head["probe_induction"] == 1.0
    assert head["scores"]["induction"] == pytest.approx(length / n, abs=1e-12)  # 5 of 11 rows are on the pattern
    assert head["scores"]["first_token"] == pytest.approx((offset + length) / n, abs=1e-12)
    assert data["strongest"]["probe_induction"] == {"layer": 1, "head": 2, "score": 1.0}
    uniform_score = sum(1 / (t + 1) for t in range(offset + length, n)) / length
    assert data["heads"][0]["probe_induction"] == pytest.approx(uniform_score, abs=1e-12)
    out = io.StringIO()
    render_text(decoder_heads_document(data, 2, "handmade"), out)
    assert "Top induction heads on the probe: layer 1 head 2 (1.00);" in out.getvalue()


# ---------------------------------------------------------------- text and markdown


@pytest.mark.parametrize("family", ["gpt2", "llama", *NEWER])
def test_text_rows_carry_the_json_numbers(run_cli, folders, family):
    folder = str(folders[family])
    data = json_of(run_cli, REPEATS, "--model", folder)
    status, out, err = run_cli("heads", REPEATS, "--model", folder, "--precision", "3")
    assert status == 0 and err == ""
    assert out.startswith(f"Attention heads of {family}\n")
    assert "TransformerLens" in out and "induction" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["0"], ["1"]) and len(line.split()) >= 8]
    assert len(rows) == 8
    for words, record in zip(rows, data["heads"]):
        numbers = [f"{record['scores'][name]:.3f}" for name in NAMES] + [f"{record['entropy']:.3f}"]
        assert words[:2] == [str(record["layer"]), str(record["head"])]
        assert " ".join(words[2:-5]) == record["role"]
        assert words[-5:] == numbers
    for name in NAMES:
        best = data["strongest"][name]
        if best["score"] > 0:
            assert f"{ROLE_OF[name]}:" in out and f"layer {best['layer']} head {best['head']} ({best['score']:.3f})" in out
    assert max(len(line) for line in out.splitlines()) <= 100


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_markdown(run_cli, folders, family):
    status, out, err = run_cli("heads", REPEATS, "--model", str(folders[family]), "--format", "markdown")
    assert status == 0 and err == ""
    assert out.startswith(f"# Attention heads of {family}\n")
    assert "| layer | head | role | prev | dup | induct | first | H bits |" in out
    assert "## Summary" in out


def test_probe_text_has_a_probe_column_and_the_top_heads(run_cli, folders):
    folder = str(folders["llama"])
    data = json_of(run_cli, "--model", folder, "--probe", "induction", "--probe-length", "6")
    status, out, err = run_cli("heads", "--model", folder, "--probe", "induction", "--probe-length", "6")
    assert status == 0 and err == ""
    assert "Probe (induction): the first token '<s>', then 6 random tokens (seed 0)" in out
    assert "H bits   probe" in out
    top = min(data["heads"], key=lambda h: (-h["probe_induction"], h["layer"], h["head"]))
    assert f"Top induction heads on the probe: layer {top['layer']} head {top['head']} " in out
    assert "--probe induction --probe-length 6 --seed 1" in out


# ---------------------------------------------------------------- encoders, errors, speed


def test_an_encoder_keeps_its_own_roles(run_cli, folders):
    data = json_of(run_cli, "the cat", "--model", str(folders["bert"]))
    assert list(data) == ["model", "sentence", "tokens", "threshold", "heads", "roles"]
    assert {"share", "shares", "normalized_entropy", "focus"} <= set(data["heads"][0])
    assert "scores" not in data["heads"][0]


@pytest.mark.parametrize("argv, fragment", [
    (["the cat", "--probe", "induction"], "give no sentence with it"),
    (["--probe", "induction", "--probe-length", "40"], "give at most 31"),  # 1 + 2 * 40 > 64 positions
    (["--probe", "induction", "--probe-length", "1"], "at least 2"),
    (["--probe", "induction", "--seed", "-1"], "--seed must be"),
    (["--seed", "3"], "with --probe induction"),
    (["--probe", "copying"], "invalid choice"),
])
def test_user_errors_are_one_line(run_cli, folders, argv, fragment):
    status, out, err = run_cli("heads", *argv, "--model", str(folders["llama"]))
    assert status == 2 and out == ""
    assert err.startswith("selfattn") and err.count("\n") == 1 and fragment in err


def test_gpt2_probe_length_is_bounded_by_its_positions(run_cli, folders):
    folder = str(folders["gpt2"])
    assert len(json_of(run_cli, "--model", folder, "--probe", "induction", "--probe-length", "32")["ids"]) == 64
    status, out, err = run_cli("heads", "--model", folder, "--probe", "induction", "--probe-length", "33")
    assert status == 2 and out == "" and err.count("\n") == 1 and "at most 32" in err


def test_the_probe_refuses_an_encoder(run_cli, folders):
    status, out, err = run_cli("heads", "--model", str(folders["bert"]), "--probe", "induction")
    assert status == 2 and out == "" and err.count("\n") == 1
    assert "needs a decoder" in err and "encoder" in err


def test_a_tiny_decoder_takes_well_under_a_second(folders):
    from selfattn.commands.heads import heads_command

    folder = str(folders["llama"])
    heads_command(REPEATS, folder, "json", 2, io.StringIO())  # loads the model once
    start = time.perf_counter()
    heads_command(REPEATS, folder, "text", 2, io.StringIO())
    heads_command(None, folder, "json", 2, io.StringIO(), probe="induction")
    assert time.perf_counter() - start < 1.0
