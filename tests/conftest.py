import os
import sys
from pathlib import Path

# Triton's interpreter runs our Triton kernels on CPU tensors (tests/test_triton_flash.py). It
# must be chosen before triton is first imported, by anything: triton's own library functions
# (tl.zeros, ...) are made for the interpreter or for a GPU at that moment. No other test
# uses Triton; on a machine with CUDA, test_triton_flash.py says it is for the CPU.
os.environ.setdefault("TRITON_INTERPRET", "1")

# The suite starts hundreds of Python processes (the CLI's wiring, torchrun's ranks, the
# benchmarks' smoke runs). Where the environment says PYTHONDONTWRITEBYTECODE, each of them
# would compile selfattn's modules anew (about 0.4 s each), and pytest would rewrite every
# test module at each collection: the suite keeps its compiled files (in __pycache__, which
# git ignores) for itself and the processes it starts.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from seed_reference import INPUTS  # noqa: E402

# The tests use tiny tensors, where thread start-up costs more than the arithmetic
# (a small LayerNorm is ~100x slower with 2 threads than with 1 on this machine).
torch.set_num_threads(1)


SLOW_TIER = pytest.StashKey[tuple[set, set]]()


@pytest.hookimpl(tryfirst=True)  # before -m and -k deselect: the slow tier as written, whatever runs
def pytest_collection_modifyitems(config, items):
    """The files that hold the slow tier run first (each file keeps its own order): with
    pytest-xdist's file-by-file distribution (`make test`) the longest work starts at once
    and the short files fill in around it, instead of one worker finishing a long file alone."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # a stable sort: False (slow files) first
    config.stash[SLOW_TIER] = ({f"{item.path.name}::{item.originalname}" for item in items if item.get_closest_marker("slow")},
                               {item.path.name for item in items})


@pytest.fixture(scope="session")
def slow_tier(request) -> tuple[set, set]:
    """(the slow-marked tests as "file::function", the test files collected), read before any deselection."""
    return request.config.stash[SLOW_TIER]


@pytest.fixture(scope="session", autouse=True)
def shared_folder(tmp_path_factory) -> Path:
    """A folder for what the session makes once and several test files read (trained runs):
    pytest-xdist's workers each get their own temporary folder, inside one they share."""
    import training_runs

    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    training_runs.set_root(folder)
    return folder


@pytest.fixture
def seed_x() -> torch.Tensor:
    return torch.tensor(INPUTS)  # float32, as in the seed


@pytest.fixture
def run_cli(capsys):
    """Run ``selfattn`` in-process; returns (exit status, stdout, stderr)."""
    from selfattn.cli import main

    def run(*argv: str):
        try:
            status = main(list(argv))
        except SystemExit as exit_:  # argparse's --help / usage errors
            status = exit_.code
        out, err = capsys.readouterr()
        return status, out, err

    return run


@pytest.fixture
def read_only_folder(tmp_path, monkeypatch):
    """A folder nobody may write in. Root may write anyway, so the permission check sees it too."""
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != folder and real_access(path, mode))
    yield folder
    folder.chmod(0o700)


@pytest.fixture
def drawn(monkeypatch):
    """Record every figure the CLI saves, so a test can read what it holds."""
    figures = []
    from selfattn.render.visual import plots

    save = plots.save_figure

    def recording(figure, path):
        figures.append(figure)
        return save(figure, path)

    monkeypatch.setattr(plots, "save_figure", recording)
    return figures
