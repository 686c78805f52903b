"""`selfattn train`: Ctrl-C saves a checkpoint, --resume continues it exactly; bad input is one line.

The interrupted run is the real command in a subprocess, stopped with SIGINT as a
terminal's Ctrl-C would; the run it must equal is the same settings trained without a
stop, in this process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time

import pytest
import torch
from safetensors.torch import load_file
from training_runs import (
    CLI_SEED,
    CLI_STEPS,
    one_error_line,
    read_lines,
    shared_run,
    start_cli,
)

import selfattn as sa


@pytest.fixture(scope="module")
def uninterrupted():
    """The CLI's defaults for CLI_STEPS steps, trained without a stop."""
    return shared_run("cli-defaults", steps=CLI_STEPS, seed=CLI_SEED)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """`selfattn train` stopped by SIGINT once it has logged once: (folder, exit status, stdout, stderr, lines)."""
    folder = tmp_path_factory.mktemp("interrupted") / "run"
    proc = start_cli("train", "--steps", str(CLI_STEPS), "--out", str(folder), "--seed", str(CLI_SEED))
    deadline = time.monotonic() + 240
    try:
        while not _has_a_line(folder / "metrics.jsonl"):
            assert proc.poll() is None, f"the run ended before logging: {proc.communicate()}"
            assert time.monotonic() < deadline, "the run logged nothing in 240 s"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return folder, proc.returncode, out, err, read_lines(folder / "metrics.jsonl")


def _has_a_line(path) -> bool:
    """Whether ``path`` holds a whole line yet (a line being appended may be read half written)."""
    return path.is_file() and b"\n" in path.read_bytes()


# --- 4. interrupt and resume -----------------------------------------------------------

@pytest.mark.slow  # a real run stopped by SIGINT, then resumed
def test_ctrl_c_exits_130_and_says_how_to_continue(interrupted):
    folder, status, out, err, _ = interrupted
    assert status == 130, err
    step = json.loads((folder / "training.json").read_text(encoding="utf-8"))["step"]
    assert 25 <= step < CLI_STEPS
    assert f"interrupted at step {step}: checkpoint saved in {folder}; continue with --resume" in err
    assert f"continue with: selfattn train --out {folder} --resume" in out.splitlines()
    assert f"step {step} of {CLI_STEPS} (interrupted)" in out


@pytest.mark.slow  # a real run stopped by SIGINT, then resumed
def test_the_interrupted_checkpoint_is_intact(interrupted):
    folder, _, _, _, lines = interrupted
    settings = json.loads((folder / "training.json").read_text(encoding="utf-8"))
    assert settings["finished"] is False
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))  # parses
    assert config["model_type"] == "gpt2" and config["n_layer"] == 2
    weights = load_file(folder / "model.safetensors")
    assert weights["transformer.wte.weight"].shape == (config["vocab_size"], config["n_embd"])
    state = torch.load(folder / "train_state.pt", weights_only=True)  # no pickle needed
    assert state["step"] == settings["step"] and set(state) >= {"model", "optimizer"}
    assert not list(folder.glob("*.partial"))  # every file was written whole
    model = sa.load_pretrained(folder)
    ids = torch.tensor(json.loads((folder / "probe.json").read_text(encoding="utf-8"))["ids"])
    assert torch.isfinite(model(ids[None]).logits).all()
    assert [r["step"] for r in lines] == [s for s in range(25, settings["step"] + 1, 25)]


@pytest.fixture(scope="module")
def resumed(interrupted):
    """`selfattn train --resume` on a copy of the interrupted run (the original stays as Ctrl-C left it)."""
    folder = interrupted[0].with_name("resumed")
    shutil.copytree(interrupted[0], folder)
    proc = start_cli("train", "--out", str(folder), "--resume")
    out, err = proc.communicate(timeout=300)
    return folder, proc.returncode, out, err


@pytest.mark.slow  # a real run stopped by SIGINT, then resumed
def test_a_resumed_run_equals_an_uninterrupted_one(uninterrupted, resumed):
    folder, status, out, err = resumed
    assert status == 0, err
    assert f"step {CLI_STEPS} of {CLI_STEPS}" in out
    assert json.loads((folder / "training.json").read_text(encoding="utf-8"))["finished"] is True
    ours, theirs = read_lines(folder / "metrics.jsonl"), uninterrupted.metrics
    assert [r["step"] for r in ours] == [r["step"] for r in theirs] == [25, 50, 75, 80]
    for mine, expected in zip(ours, theirs):
        # The same batches, weights and optimiser state: the same numbers to the last bit.
        for key in ("train_loss", "val_loss", "lr", "probe_loss", "heads"):
            assert mine[key] == expected[key], (mine["step"], key, mine[key], expected[key])
    a, b = load_file(folder / "model.safetensors"), load_file(uninterrupted.folder / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("extra", [[], ["--steps", str(CLI_STEPS)], ["--steps", "10"]], ids=["no-steps", "equal", "fewer"])
def test_resuming_a_finished_run_is_an_error(run_cli, uninterrupted, extra):
    # Nothing is left to train: the command must say so (exit 2), not report the old run as done.
    before = {p.name: p.stat().st_mtime_ns for p in uninterrupted.folder.iterdir()}
    status, out, err = run_cli("train", "--out", str(uninterrupted.folder), "--resume", *extra)
    assert status == 2 and out == "", (extra, out, err)
    assert re.search(rf"has done {CLI_STEPS} steps already|finished", one_error_line(err)), (extra, err)
    assert {p.name: p.stat().st_mtime_ns for p in uninterrupted.folder.iterdir()} == before


# --- 7. bad input ----------------------------------------------------------------------

def _refused(run_cli, *args, match: str):
    status, out, err = run_cli("train", *args)
    assert status == 2 and out == "", (args, status, out, err)
    line = one_error_line(err)
    assert re.search(match, line), (args, line)
    return line


@pytest.fixture
def corpus(tmp_path):
    def write(data: bytes):
        path = tmp_path / "corpus.txt"
        path.write_bytes(data)
        return str(path)

    return write


@pytest.mark.parametrize("args, match", [
    (["--task", "poetry"], r"unknown task 'poetry': choose induction or text"),
    (["--corpus", "shakespeare"], r"--corpus goes with --task text"),
    (["--task", "induction", "--corpus", "notes.txt"], r"--corpus goes with --task text"),
    (["--steps", "0"], r"steps must be a whole number from 1 to 1,000,000, got 0"),
    (["--steps", "-5"], r"steps must be a whole number from 1 to 1,000,000, got -5"),
    (["--steps", "2000000"], r"steps must be a whole number from 1 to 1,000,000, got 2000000"),
    (["--seed", "-1"], r"seed must be a whole number"),
])
def test_bad_settings(run_cli, tmp_path, args, match):
    out = tmp_path / "run"
    _refused(run_cli, *args, "--out", str(out), match=match)
    assert not out.exists()  # refused before anything was made


@pytest.mark.parametrize("data, match", [
    (b"", r"corpus\.txt is empty"),
    (b" \n\t\n", r"corpus\.txt is empty"),
    (b"some text\x00more text" * 100, r"corpus\.txt is binary \(it holds NUL bytes\)"),
    (b"caf\xe9 au lait, " * 100, r"corpus\.txt is not UTF-8 text \(byte 3 is not\)"),
    (b"To be or not to be. " * 15, r"corpus\.txt has 300 characters; training needs at least 652"),
])
def test_bad_corpus_files(run_cli, corpus, tmp_path, data, match):
    out = tmp_path / "run"
    _refused(run_cli, "--task", "text", "--corpus", corpus(data), "--out", str(out), match=match)
    assert not out.exists()


def test_a_missing_corpus_or_a_folder(run_cli, tmp_path):
    _refused(run_cli, "--task", "text", "--corpus", str(tmp_path / "absent.txt"), "--out", str(tmp_path / "r"),
             match=r"the corpus file .*absent\.txt does not exist")
    _refused(run_cli, "--task", "text", "--corpus", str(tmp_path), "--out", str(tmp_path / "r"),
             match=r"is not a file")
    assert not (tmp_path / "r").exists()  # nothing written before the corpus was read


def test_an_output_folder_that_cannot_be_written(run_cli, read_only_folder):
    # read_only_folder (conftest) is chmod 0o500 and reported unwritable even to root.
    for out in (read_only_folder, read_only_folder / "run"):
        _refused(run_cli, "--steps", "5", "--out", str(out), match=r"cannot write the output folder .*permission denied")
    assert list(read_only_folder.iterdir()) == []


def test_output_paths_that_are_taken(run_cli, tmp_path, uninterrupted):
    file = tmp_path / "a-file"
    file.write_text("x")
    _refused(run_cli, "--steps", "5", "--out", str(file), match=r"the output .*a-file is a file, not a folder")
    other = tmp_path / "notes"
    other.mkdir()
    (other / "readme.txt").write_text("mine")
    _refused(run_cli, "--steps", "5", "--out", str(other), match=r"the output folder .*notes is not empty")
    assert [p.name for p in other.iterdir()] == ["readme.txt"]
    before = (uninterrupted.folder / "metrics.jsonl").read_bytes()
    _refused(run_cli, "--steps", "5", "--out", str(uninterrupted.folder),
             match=rf"holds another run \(induction, step {CLI_STEPS} of {CLI_STEPS}\).*--resume")
    assert (uninterrupted.folder / "metrics.jsonl").read_bytes() == before


def test_resume_without_a_run(run_cli, tmp_path):
    _refused(run_cli, "--out", str(tmp_path / "absent"), "--resume", match=r"there is no run to resume in .*absent")
    assert not (tmp_path / "absent").exists()
    (tmp_path / "empty").mkdir()
    _refused(run_cli, "--out", str(tmp_path / "empty"), "--resume", match=r"no run to resume .*no training\.json")
    assert list((tmp_path / "empty").iterdir()) == []


def test_resume_without_a_checkpoint_or_with_other_settings(run_cli, tmp_path, uninterrupted):
    half = tmp_path / "half"
    half.mkdir()
    (half / "training.json").write_bytes((uninterrupted.folder / "training.json").read_bytes())
    _refused(run_cli, "--out", str(half), "--resume", match=r"saved no checkpoint yet \(train_state\.pt is missing\)")
    _refused(run_cli, "--out", str(uninterrupted.folder), "--resume", "--steps", "500", "--seed", "9",
             match=rf"has seed {CLI_SEED}, not 9: resume it as it was")
