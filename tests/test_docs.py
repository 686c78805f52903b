"""The README and the docs pages do what they show, and the site builds strictly.

The rules for each kind of code block are in ``doc_blocks.py``. The site is built with
``mkdocs build --strict`` (a broken link, a page missing from the navigation or an API
reference that does not resolve fails), and every public name must be in the reference.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import (
    MAKES,
    PAGES,
    ROOT,
    blocks,
    console_sessions,
    inline_commands,
    missing_from_output,
    run_python,
    saved_files,
    setup_scripts,
    shell_commands,
)

import selfattn
from selfattn import distributed, masks


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.fixture(scope="session")
def made_folders(tmp_path_factory):
    """The folders the pages' setup scripts make (``python title="makes NAME/"``), made once."""
    root = tmp_path_factory.mktemp("made")
    here = os.getcwd()
    os.chdir(root)
    try:
        for name, block in setup_scripts().items():
            failed = run_python(block.body, f"{block.page}:{block.line}", {})
            assert failed == [] and (root / name).is_dir(), f"{block.page}:{block.line} did not make {name}/"
    finally:
        os.chdir(here)
    return root


@pytest.fixture
def in_scratch_folder(tmp_path, monkeypatch, made_folders):
    """Commands run in an empty folder, with the embeddings file the guides name, the files the pages show,
    and the folders their setup scripts make."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "table.json").write_text(json.dumps({"my": [0.1, 0.9, 0.3], "own": [0.7, 0.2, 0.5], "words": [0.4, 0.4, 0.8]}))
    for name, body in saved_files().items():
        (tmp_path / name).write_text(body)
    for folder in made_folders.iterdir():
        (tmp_path / folder.name).symlink_to(folder, target_is_directory=True)
    return tmp_path


PYTHON_PAGES = [p for p in PAGES if any("torchrun" not in b.info for b in blocks(p, "python"))]


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=page_id)
def test_python_blocks_run_and_their_claims_hold(page, in_scratch_folder):
    namespace: dict = {}
    failed = []
    for block in blocks(page, "python"):
        if "torchrun" not in block.info and not MAKES.fullmatch(block.info):  # torchrun: below; setup: once, above
            failed += run_python(block.body, f"{block.page}:{block.line}", namespace)
    assert failed == []


SESSIONS = [(f"{b.page}:{b.line}", args, excerpt) for p in PAGES for b in blocks(p, "console") for args, excerpt in console_sessions(b)]
COMMANDS = [(f"{b.page}:{b.line}", args) for p in PAGES for b in blocks(p, "sh") for args in shell_commands(b)]
COMMANDS += [(page_id(p), args) for p in PAGES for args in inline_commands(p)]
# A command some console block shows is run there, its output checked too: not twice (a training run takes 40 s).
COMMANDS = [(where, args) for where, args in COMMANDS if args not in [session[1] for session in SESSIONS]]


def run_and_check(run_cli, where: str, args: list[str]) -> str:
    status, out, err = run_cli(*args)
    # train's progress lines go to stderr (so its summary piped to a file stays clean); nothing else writes there
    progress = args[0] == "train" and all(line.startswith(("training ", "step ")) for line in err.splitlines())
    assert status == 0 and (err == "" or progress), (where, args, err)
    if "-o" in args:
        assert Path(args[args.index("-o") + 1]).stat().st_size > 1000, (where, args)
    else:
        assert out, (where, args)
    return out


@pytest.mark.parametrize(("where", "args"), COMMANDS, ids=[f"{w} {' '.join(a)[:60]}" for w, a in COMMANDS])
def test_shell_commands_run(run_cli, in_scratch_folder, where, args):
    run_and_check(run_cli, where, args)


# A page's training run trains for real (400 steps, the phase change included): the slow tier.
SESSION_PARAMS = [pytest.param(*session, marks=[pytest.mark.slow] if session[1][0] == "train" else [],
                               id=f"{session[0]} {' '.join(session[1])[:60]}") for session in SESSIONS]


@pytest.mark.parametrize(("where", "args", "excerpt"), SESSION_PARAMS)
def test_console_excerpts_match_what_the_command_prints(run_cli, in_scratch_folder, where, args, excerpt):
    out = run_and_check(run_cli, where, args)
    assert missing_from_output(excerpt, out) == [], f"{where}: these lines are not in the output of selfattn {' '.join(args)}"


def test_the_pages_hold_runnable_blocks_of_every_kind():
    assert len(PYTHON_PAGES) >= 6 and len(COMMANDS) >= 50 and len(SESSIONS) >= 8
    assert missing_from_output(["a", "...", "c"], "a\nb\nc\n") == []
    assert missing_from_output(["c", "a"], "a\nb\nc\n") == ["a"]  # order counts


def test_ring_attention_example_runs_under_torchrun(tmp_path):
    """The guide's ring example, as a script on 2 gloo ranks, checked against SDPA on the full sequence."""
    (block,) = [b for p in PAGES for b in blocks(p, "python") if "torchrun" in b.info]
    check = (
        "\nimport torch.nn.functional as F\n"
        "torch.manual_seed(0)\n"
        "fq, fk, fv = (torch.randn(1, 8, 4096, 64) for _ in range(3))\n"
        "torch.testing.assert_close(full, F.scaled_dot_product_attention(fq, fk, fv, is_causal=True), atol=1e-5, rtol=1e-5)\n"
        "print('rank', positions, 'ok')\n"
    )
    script = tmp_path / "my_script.py"
    script.write_text(block.body.replace("dist.destroy_process_group()", "") + check)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", str(script)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("ok") == 2


README = (ROOT / "README.md").read_text()


def test_the_architecture_picture_is_what_the_code_draws_today():
    """docs/architecture.md holds the house exactly as docs/make_architecture.py draws it from the imports now."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_architecture", ROOT / "docs" / "make_architecture.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    drawn = script.block()
    assert "commands" in drawn and "leaves" in drawn and "imports down" in drawn
    assert script.page_block(page) == drawn, "the picture is stale: run .venv/bin/python docs/make_architecture.py --write"


def test_the_architecture_page_names_every_module_in_its_prose():
    """A newcomer reads where each module lives and what it holds: every file of src/selfattn
    (but the packages' __init__.py, whose docstrings say it) appears by name outside the picture."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_architecture", ROOT / "docs" / "make_architecture.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    prose = page.replace(script.page_block(page), "")
    named = set(re.findall(r"(\w+\.py)\b", prose))
    modules = sorted(p.relative_to(ROOT / "src" / "selfattn").as_posix()
                     for p in (ROOT / "src" / "selfattn").rglob("*.py") if p.name != "__init__.py")
    unnamed = [m for m in modules if m.rsplit("/", 1)[-1] not in named]
    assert unnamed == [], f"modules docs/architecture.md never names: {unnamed}"
    assert len(modules) > 150 and "cli/options.py" in modules  # the files were found


def test_readme_is_the_short_front_door():
    assert len(README.splitlines()) <= 300
    assert README.count("```sh\nmake run") == 1 and "make test" in README.split("## Quick start")[1].split("##")[0]
    path = README.split("## Learning path")[1].split("\n## ")[0]
    assert len(re.findall(r"^\d+\. \*\*", path, re.M)) >= 8


def test_the_slow_tier_is_listed_with_its_times_in_testing_md(slow_tier):
    """docs/testing.md's table of the slow tier names every test marked slow (by file and
    function), with its time and what it catches; and each test it names, in a file this
    session collected, is marked slow."""
    section = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8").split("## How long it takes")[1].split("\n## ")[0]
    table = section.split("### The slow tier")[1]
    rows = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split(" | ")] if line.startswith("| `") else []
        if cells:
            assert len(cells) == 3 and re.fullmatch(r"\d+ s", cells[1]) and len(cells[2]) >= 40, line
            rows += re.findall(r"`([\w.]+\.py::\w+)`", cells[0])
    marked, collected = slow_tier
    assert marked, "no test is marked slow: the tier is gone or the marks were not read"
    assert not marked - set(rows), f"marked slow, missing from docs/testing.md: {sorted(marked - set(rows))}"
    listed = {row for row in rows if row.split("::")[0] in collected}
    assert not listed - marked, f"listed as slow, not marked so: {sorted(listed - marked)}"


def test_readme_links_lead_to_files_that_exist():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert len(links) >= 10
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert missing == []


def public_paths() -> dict[str, str]:
    """Each public name -> the dotted path of its definition (the reference page's anchor)."""
    paths = {}
    for module in (selfattn, masks, distributed):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                paths[f"{module.__name__}.{name}"] = f"{obj.__module__}.{obj.__qualname__}"
    return paths


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs tools are not installed: pip install -e '.[docs]'")
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return site


def test_the_site_builds_strictly_with_every_page(built_site):
    for page in PAGES[1:]:
        html = (built_site / page.relative_to(ROOT / "docs")).with_suffix(".html")
        assert html.is_file(), page
        text = html.read_text()
        assert "```" not in text, f"{page}: a code fence did not render (an info string or indent it cannot read)"
        assert "\\|" not in text, f"{page}: an escaped | shows its backslash (write the choices without a pipe)"


def test_the_site_loads_nothing_from_the_network(built_site):
    """Scripts, styles, fonts and pictures all come from the site itself."""
    loads = re.compile(r"<(?:script|img|link|iframe)\b[^>]*\b(?:src|href)=\"(https?:)?//", re.I)
    pages = sorted(built_site.rglob("*.html"))
    assert len(pages) >= 15
    assert [str(p.relative_to(built_site)) for p in pages if loads.search(p.read_text())] == []


def test_every_public_name_is_in_the_api_reference(built_site):
    html = (built_site / "reference.html").read_text()
    anchors = set(re.findall(r'id="([\w.]+)"', html))
    paths = public_paths()
    assert len(paths) >= 80
    missing = sorted(name for name, path in paths.items() if path not in anchors)
    assert missing == []
    constants = [f"{m.__name__}.{n}" for m in (selfattn, masks) for n in m.__all__ if n.isupper()]
    named = {a.rsplit(".", 1)[-1] for a in anchors}
    assert [c for c in constants if c.rsplit(".", 1)[-1] not in named] == []
