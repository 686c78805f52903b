"""The `selfattn explain` command end to end: formats, options and every user error."""

import json
import re
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seed_reference import INPUTS, TOKENS
from terminal import run_in_terminal

ESC = "\x1b"


def test_text_walks_through_every_step(run_cli):
    status, out, err = run_cli("explain")
    assert status == 0 and err == ""
    for heading in ("Step 1", "Step 2", "Step 3", "Step 4", "The stable form", "Step 5", "Step 6", "Summary"):
        assert heading in out
    assert "← query" in out and "x^(2)" in out
    assert ESC not in out  # captured output is not a terminal


def test_json_has_the_stable_keys(run_cli):
    status, out, _ = run_cli("explain", "--format", "json")
    data = json.loads(out)
    assert status == 0
    assert {"tokens", "embeddings", "query", "scores", "weights", "context"} <= set(data)
    assert {"index", "token", "scores", "exp", "exp_sum", "weights", "context"} <= set(data["query"])
    n, d = len(data["tokens"]), len(data["embeddings"][0])
    assert (n, d) == (7, 3)
    assert len(data["scores"]) == n and all(len(row) == n for row in data["scores"] + data["weights"])
    assert len(data["context"]) == n and all(len(row) == d for row in data["context"])
    # The stable form's numbers, checked with plain math on the JSON's own scores.
    query, stable = data["query"], data["query"]["stable"]
    assert stable["max"] == max(query["scores"])
    assert stable["shifted"] == pytest.approx([s - stable["max"] for s in query["scores"]], abs=1e-6)
    assert stable["exp"] == pytest.approx([math.exp(s - stable["max"]) for s in query["scores"]], rel=1e-6)
    assert stable["exp_sum"] == pytest.approx(sum(stable["exp"]), rel=1e-6)
    assert query["weights"] == pytest.approx([e / stable["exp_sum"] for e in stable["exp"]], rel=1e-6)
    assert query["exp"] == pytest.approx([math.exp(s) for s in query["scores"]], rel=1e-6)
    assert query["naive_overflow"] is False


def test_markdown_has_headings_and_tables(run_cli):
    status, out, _ = run_cli("explain", "--format", "markdown")
    assert status == 0
    assert out.startswith("# ") and "## Step 4 · Softmax" in out
    assert "| token | ω | exp(ω) | α = exp(ω) / sum |" in out
    assert "| **cat** | **1.3581** | **3.8888** | **0.1919** |" in out
    assert "| The | 0.6682 | 1.9507 | 0.0962 |" in out
    assert ESC not in out


def _check_against_sdpa(data):
    x = torch.tensor(data["embeddings"], dtype=torch.float64)
    expected = F.scaled_dot_product_attention(x, x, x, scale=1.0)
    torch.testing.assert_close(torch.tensor(data["context"], dtype=torch.float64), expected, rtol=1e-5, atol=1e-6)
    weights = torch.softmax(x @ x.T, dim=-1)
    torch.testing.assert_close(torch.tensor(data["weights"], dtype=torch.float64), weights, rtol=1e-5, atol=1e-6)
    q = data["query"]["index"]
    torch.testing.assert_close(torch.tensor(data["query"]["weights"], dtype=torch.float64), weights[q], rtol=1e-5, atol=1e-6)


def test_random_embeddings_for_any_sentence(run_cli):
    status, out, _ = run_cli("explain", "A dog chased the ball", "--embed", "random", "--dim", "6", "--seed", "3",
                             "--format", "json", "--query", "ball")
    data = json.loads(out)
    assert status == 0
    assert data["tokens"] == ["A", "dog", "chased", "the", "ball"]
    assert data["query"]["index"] == 4 and len(data["embeddings"][0]) == 6
    assert data["embedding_source"]["kind"] == "random" and data["embedding_source"]["trained"] is False
    _check_against_sdpa(data)
    again = json.loads(run_cli("explain", "A dog chased the ball", "--embed", "random", "--dim", "6", "--seed", "3",
                               "--format", "json")[1])
    assert again["embeddings"] == data["embeddings"]  # seeded: reproducible


def test_unknown_words_fall_back_to_labelled_random_vectors(run_cli):
    status, out, _ = run_cli("explain", "hello there world")
    assert status == 0
    assert "untrained" in out and "random" in out and "'hello'" in out


@pytest.mark.parametrize("suffix", [".json", ".csv", ".npy", ".pt", ".safetensors"])
def test_embedding_files_of_every_format(run_cli, tmp_path, suffix):
    from safetensors.torch import save_file

    matrix = torch.tensor(INPUTS)
    path = tmp_path / f"emb{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(dict(zip(TOKENS, INPUTS))))
    elif suffix == ".csv":
        path.write_text("\n".join(",".join(str(v) for v in row) for row in INPUTS))
    elif suffix == ".npy":
        np.save(path, matrix.numpy())
    elif suffix == ".pt":
        torch.save(matrix, path)
    else:
        save_file({"embeddings": matrix}, str(path))
    status, out, err = run_cli("explain", "--embeddings", str(path), "--format", "json")
    assert status == 0, err
    data = json.loads(out)
    assert data["embedding_source"]["kind"] == "file"
    torch.testing.assert_close(torch.tensor(data["embeddings"]), matrix)
    assert [round(v, 4) for v in data["query"]["context"]] == [0.4964, 0.6149, 0.5813]


def test_query_selection_by_token_and_position(run_cli):
    by_token = json.loads(run_cli("explain", "--query", "the", "--format", "json")[1])["query"]
    by_position = json.loads(run_cli("explain", "--query", "4", "--format", "json")[1])["query"]
    first = json.loads(run_cli("explain", "--query", "The", "--format", "json")[1])["query"]
    assert by_token["index"] == by_position["index"] == 4 and by_token["token"] == "the"
    assert first["index"] == 0 and first["token"] == "The"


def test_precision_changes_the_printed_decimals(run_cli):
    out = run_cli("explain", "--precision", "2")[1]
    assert "ω = [0.67, 1.36, 1.27, 0.76, 0.67, 1.09, 1.33]" in out
    out = run_cli("explain", "--precision", "6", "--format", "markdown")[1]
    assert "z^(2) = [0.496399, 0.614882, 0.581337]" in out


def test_naive_overflow_is_explained_and_json_stays_valid(run_cli):
    args = ("explain", "one two three", "--embed", "random", "--dim", "400", "--seed", "1")
    status, out, _ = run_cli(*args)
    assert status == 0 and "Warning" in out and "naive form breaks down" in out
    status, out, _ = run_cli(*args, "--format", "json")
    data = json.loads(out)  # strict JSON: no bare Infinity or NaN
    assert data["query"]["naive_overflow"] is True
    assert "inf" in data["query"]["exp"] and data["query"]["exp_sum"] == "inf"
    weights = data["query"]["weights"]
    assert all(isinstance(w, float) and math.isfinite(w) for w in weights)
    _check_against_sdpa(data)


def test_long_sentences_run_in_every_format_up_to_the_toy_positions(run_cli):
    sentence = " ".join(f"w{i}" for i in range(30))
    status, out, err = run_cli("explain", sentence)
    assert status == 0 and err == ""
    # 30 keys are more than a text matrix shows: its first and last columns, and a line saying so.
    cut = re.findall(r"… left out: (\d+) columns \(tokens (\d+)-(\d+)\); --format json has them all\.", out)
    assert len(cut) == 2 and all(int(count) == int(last) - int(first) + 1 for count, first, last in cut), cut
    status, out, _ = run_cli("explain", sentence, "--format", "json")
    assert status == 0 and len(json.loads(out)["tokens"]) == 30
    for output in ("text", "json", "markdown"):
        status, out, err = run_cli("explain", " ".join(["w"] * 600), "--format", output)
        assert status == 2 and out == "" and err.count("\n") == 1
        assert "600 tokens" in err and "at most 512" in err and "every format" in err


def _write(path, text):
    path.write_text(text)
    return str(path)


@pytest.fixture
def bad_inputs(tmp_path):
    """Each case: CLI arguments after 'explain', and a fragment the error must contain."""
    return [
        (["   "], "empty"),
        ([""], "empty"),
        (["--query", "dog"], "'dog' is not in the sentence"),
        (["--query", "12"], "out of range"),
        (["--embeddings", str(tmp_path / "missing.json")], "missing.json"),
        (["--embeddings", str(tmp_path)], "embeddings"),
        (["--embeddings", _write(tmp_path / "e.txt", "1,2,3")], "e.txt"),
        (["--embeddings", _write(tmp_path / "rows.csv", "1,2,3\n4,5,6")], "2 rows but the sentence has 7 tokens"),
        (["--embeddings", _write(tmp_path / "map.json", json.dumps({"The": [1, 2, 3]}))], "no embedding for token"),
        (["--embeddings", _write(tmp_path / "ragged.csv", "1,2,3\n4,5\n" + "1,2,3\n" * 5)], "ragged.csv"),
        (["--embeddings", _write(tmp_path / "word.csv", "1,2,x\n" * 7)], "word.csv"),
        (["--embeddings", _write(tmp_path / "nan.json", json.dumps([[1, 2, 3]] * 6 + [[1, 2, float("nan")]]))], "nan.json"),
        (["--embeddings", _write(tmp_path / "inf.csv", "1,2,3\n" * 6 + "1,2,inf\n")], "inf.csv"),
        (["--embeddings", _write(tmp_path / "broken.json", "{not json")], "broken.json"),
        (["--embed", "random", "--dim", "0"], "--dim must be an integer from 1 to 1024"),
        (["--embed", "random", "--dim", "5000"], "--dim must be an integer from 1 to 1024"),
        (["--precision", "-1"], "--precision must be an integer from 0 to 10"),
        (["--precision", "11"], "--precision must be an integer from 0 to 10"),
        (["--format", "xml"], "invalid choice"),
        (["--dim", "three"], "invalid int value"),
        (["--embed", "seed", "--dim", "4"], "3-dimensional"),
        (["--embeddings", "x.csv", "--embed", "random"], "exclude each other"),
        ([" ".join(["w"] * 513)], "at most 512"),
        (["--query", "-8"], "positions 0 to 6, or -7 to -1 from the end"),
        (["--query", "7"], "positions 0 to 6, or -7 to -1 from the end"),
    ]


def test_every_bad_input_is_one_line_and_exit_2(run_cli, bad_inputs):
    for args, fragment in bad_inputs:
        status, out, err = run_cli("explain", *args)
        assert status == 2, (args, err)
        assert out == "", args
        assert err.count("\n") == 1 and err.startswith("selfattn"), (args, err)
        assert "Traceback" not in err
        assert fragment in err, (args, err)


def _run(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "selfattn", *args], capture_output=True, text=True, timeout=120, **kwargs)


def test_python_dash_m_piped_output_has_no_escape_codes():
    env = dict(os.environ, FORCE_COLOR="1", TTY_COMPATIBLE="1")
    done = _run("explain", "The \x1b[31mcat sat", env=env)
    assert done.returncode == 0, done.stderr
    assert ESC not in done.stdout and "Step 6" in done.stdout
    assert "\\x1b[31mcat" in done.stdout  # a control character in a token is shown escaped


def test_help_version_and_missing_command():
    done = _run("--help")
    assert done.returncode == 0 and "explain" in done.stdout
    done = _run("explain", "--help")
    assert done.returncode == 0 and "--embeddings" in done.stdout and "0-based position" in done.stdout
    done = _run("--version")
    assert done.returncode == 0 and done.stdout.startswith("selfattn ")
    done = _run()
    assert done.returncode == 2 and "explain" in done.stderr
    done = _run("frobnicate")
    assert done.returncode == 2 and done.stderr.count("\n") == 1


def test_terminal_output_uses_rich_styling():
    """Under a pseudo-terminal the same command prints styled (escape-coded) tables."""
    status, text = run_in_terminal("explain")
    assert status == 0
    assert ESC in text and "0.4964" in text


def test_dot_products_beyond_float32_are_a_clear_error(run_cli, tmp_path):
    path = _write(tmp_path / "big.json", json.dumps({"huge": [1e20, 1.0], "small": [1.0, 2.0]}))
    status, out, err = run_cli("explain", "huge small", "--embeddings", path)
    assert status == 2 and out == "" and "overflow float32" in err and "1e+20" in err


def test_one_word_sentence(run_cli):
    data = json.loads(run_cli("explain", "The", "--format", "json")[1])
    assert data["tokens"] == ["The"] and data["query"]["index"] == 0
    assert data["weights"] == [[1.0]] and data["context"] == data["embeddings"]


def test_sentence_as_separate_words(run_cli):
    quoted = json.loads(run_cli("explain", "The cat sat", "--format", "json")[1])
    words = json.loads(run_cli("explain", "The", "cat", "sat", "--format", "json")[1])
    assert words["tokens"] == ["The", "cat", "sat"] and words == quoted


def test_a_stdout_that_cannot_encode_greek_letters_still_works():
    done = _run("explain", env=dict(os.environ, PYTHONIOENCODING="ascii"))
    assert done.returncode == 0, done.stderr
    assert "0.4964" in done.stdout and "Traceback" not in done.stderr


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sentence=st.text(max_size=60),
    query=st.one_of(st.none(), st.text(max_size=8), st.integers(-3, 30).map(str)),
    precision=st.integers(-2, 12),
    dim=st.one_of(st.none(), st.integers(-1, 1100)),
    output=st.sampled_from(["text", "json", "markdown"]),
)
def test_any_user_input_ends_in_output_or_a_one_line_error(run_cli, sentence, query, precision, dim, output):
    """Fuzz: whatever a user types, the CLI never raises; it prints a result or one error line."""
    args = ["explain", "--", sentence] if sentence.startswith("-") else ["explain", sentence]
    args[1:1] = ["--precision", str(precision), "--format", output]
    if query is not None:
        args[1:1] = ["--query=" + query]
    if dim is not None:
        args[1:1] = ["--dim", str(dim)]
    status, out, err = run_cli(*args)
    if status == 0:
        assert out and err == ""
        if output == "json":
            assert json.loads(out)["tokens"] == sentence.split()
    else:
        assert status == 2 and out == "" and err.count("\n") == 1, (args, err)


def test_the_package_help_names_every_command():
    """help(selfattn) starts with the package docstring: its Commands line lists what the parser has."""
    import re

    import selfattn
    from selfattn.cli import build_parser

    (listed,) = re.findall(r"^Commands: ``selfattn ([^`]+)``", selfattn.__doc__, re.M)
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(c.strip() for c in listed.split("|")) == sorted(subparsers.choices)
