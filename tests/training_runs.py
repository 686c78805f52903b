"""Training runs shared by the training tests, and the `selfattn train` command in a subprocess.

A run costs seconds of CPU, so the runs several test files read are made once per test
session (``shared_run``), also when pytest-xdist runs the files on several workers: the
first worker to ask trains it under a file lock, in a folder all workers share (pytest's
temporary folder for the session, which pytest prunes itself), and the others read it
back from its files. Every in-process run trains on one thread (tests/conftest.py sets
it), and every subprocess gets OMP_NUM_THREADS=1, so a run made either way follows the
same arithmetic: the loss curve of a seed depends on the number of threads.

    run = shared_run("cli-defaults", steps=80, seed=3)      # a TrainingRun, trained once
    proc = start_cli("train", "--steps", "80", "--out", str(folder))
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# The run the CLI tests interrupt and resume, and the one the torchrun test splits over two
# ranks: the CLI's defaults (only --steps and --seed given), short. It logs at steps 25,
# 50, 75 and 80, so a test that interrupts it once the first line is written has 55 steps
# (seconds) to do it in.
CLI_STEPS, CLI_SEED = 80, 3

_ROOT: Path | None = None


def set_root(folder: Path) -> None:
    """Where the session's shared runs go (tests/conftest.py: a folder every xdist worker sees)."""
    global _ROOT
    folder.mkdir(parents=True, exist_ok=True)
    _ROOT = folder


def _root() -> Path:
    global _ROOT
    if _ROOT is None:  # outside pytest's session fixture: a folder of this process's own
        _ROOT = Path(tempfile.mkdtemp(prefix="selfattn-training-tests-"))
        atexit.register(shutil.rmtree, _ROOT, True)
    return _ROOT


@contextlib.contextmanager
def _locked(path: Path):
    """Hold an exclusive lock on ``path`` (made if missing) until the block ends: one worker at a time."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@cache
def _cached(name: str, task: str, items: tuple):
    from selfattn.commands.training_pictures import read_run
    from selfattn.training import train

    folder, done = _root() / name, _root() / f"{name}.done"
    wanted = json.dumps([task, items])
    with _locked(_root() / f"{name}.lock"):
        if done.is_file():
            assert done.read_text() == wanted, f"the shared run {name!r} was made with other settings"
        else:
            shutil.rmtree(folder, ignore_errors=True)  # what a worker that stopped halfway left
            train(task, out=folder, progress=False, **dict(items))
            done.write_text(wanted)
    return read_run(folder)  # the same record in every worker, read back from the run's files


def shared_run(name: str, task: str = "induction", **settings):
    """``train(task, **settings)`` into a folder of its own, once per session (read back from its
    files, as ``read_run`` gives it); do not change its files."""
    assert torch.get_num_threads() == 1, "the shared runs are made on one thread (tests/conftest.py)"
    return _cached(name, task, tuple(sorted(settings.items())))


def cli_env() -> dict:
    """The environment of a `selfattn` subprocess: one thread, offline, this source tree first."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=path, HF_HUB_OFFLINE="1",
                PYTHONUNBUFFERED="1")


def start_cli(*args: str) -> subprocess.Popen:
    """``python -m selfattn ARGS`` started in the background, output piped (text)."""
    return subprocess.Popen([sys.executable, "-m", "selfattn", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env())


def read_lines(path: Path) -> list[dict]:
    """The JSON lines of ``path``; [] while it does not exist."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def one_error_line(err: str) -> str:
    """The single line a user error prints on stderr (asserts there is exactly one, and its prefix)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("selfattn: error: "), lines[0]
    return lines[0]
