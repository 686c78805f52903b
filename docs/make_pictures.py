"""Regenerate the pictures in docs/: one per plot kind, and screenshots of the explorer.

    .venv/bin/python docs/make_pictures.py                      # every picture
    .venv/bin/python docs/make_pictures.py plot-heatmap.png     # only the pictures named

The plots come from `selfattn plot`; the explorer screenshots from `selfattn view`,
opened in Debian's Chromium through Playwright (the same recipe as the browser tests).
The decoder's page is of the tiny random Llama that docs/models.md makes, made here by
running that page's own script (it needs transformers, as the page says).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "tests"))

from browser import chromium, recorded_page  # noqa: E402
from doc_blocks import run_python, setup_scripts  # noqa: E402

from selfattn.cli import main  # noqa: E402

PLOTS = {
    "plot-heatmap.png": ["--kind", "heatmap"],
    "plot-arrows.png": ["--kind", "arrows", "--query", "cat"],
    "plot-heads.png": ["--kind", "heads", "--variant", "multihead", "--heads", "4", "--embed", "random", "--dim", "8"],
    "plot-mask.png": ["--kind", "mask", "--mask", "causal-bottom-right:3"],
    "plot-block-map.png": ["--kind", "mask", "--mask", "sliding-window:256", "--length", "4096"],
    "plot-positional.png": ["--kind", "positional", "--positional", "sinusoidal"],
    "plot-rope.png": ["--kind", "positional", "--positional", "rope"],
    "plot-rope-distance.png": ["--kind", "rope-distance"],
    "plot-minilm-heads.png": ["--model", "all-MiniLM-L6-v2", "--kind", "heads"],
}
TINY = "tiny-llama"  # the folder docs/models.md's script makes
EXPLORERS = {  # name: (view's arguments, head, the query token hovered, by position)
    "explorer.png": ([], 0, 1),
    "explorer-gqa.png": (["--variant", "gqa", "--heads", "4", "--kv-heads", "2", "--positional", "rope", "--query", "warm"], 2, 1),
    "explorer-minilm.png": (["--model", "all-MiniLM-L6-v2", "--layer", "2", "--query", "cat"], 5, 2),  # [CLS] first
    "explorer-llama.png": (["--model", TINY, "--layer", "1", "--query", "sat", "The cat sat on the warm mat"], 3, 2),
}


def make_tiny_model(folder: Path) -> None:
    """Run docs/models.md's script in ``folder``, which makes TINY there."""
    block = setup_scripts()[TINY]
    here = os.getcwd()
    os.chdir(folder)
    try:
        if run_python(block.body, f"{block.page}:{block.line}", {}):
            raise SystemExit(f"{block.page}:{block.line} failed")
    finally:
        os.chdir(here)


def main_pictures(names: list[str] | None = None) -> None:
    """Write every picture, or only those in ``names`` (file names in docs/)."""
    unknown = sorted(set(names or ()) - set(PLOTS) - set(EXPLORERS))
    if unknown:
        raise SystemExit(f"no such picture: {', '.join(unknown)}; choose from {', '.join([*PLOTS, *EXPLORERS])}")
    for name, args in PLOTS.items():
        if names and name not in names:
            continue
        if main(["plot", *args, "-o", str(DOCS / name)]) != 0:
            raise SystemExit(f"plot {name} failed")
    explorers = {name: value for name, value in EXPLORERS.items() if not names or name in names}
    if not explorers:
        return
    scratch = Path(tempfile.mkdtemp())
    make_tiny_model(scratch)
    with chromium() as browser:
        for name, (args, head, query) in explorers.items():
            page_path = DOCS / "explorer.html"
            args = [str(scratch / TINY) if a == TINY else a for a in args]
            if main(["view", *args, "--head", str(head), "-o", str(page_path)]) != 0:
                raise SystemExit(f"view {name} failed")
            with recorded_page(browser, viewport={"width": 1100, "height": 760}) as page:
                page.load(page_path.read_text(encoding="utf-8"))
                page.locator("text.token.query").nth(query).hover()
                page.screenshot(path=str(DOCS / name), full_page=True)
                page.assert_quiet()
            page_path.unlink()
            print(f"wrote {DOCS / name}")


if __name__ == "__main__":
    main_pictures(sys.argv[1:])
