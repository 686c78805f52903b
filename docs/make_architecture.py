"""Draw the house: selfattn's layers and the imports between them, read from the code.

    .venv/bin/python docs/make_architecture.py           # prints the picture
    .venv/bin/python docs/make_architecture.py --write   # puts it into docs/architecture.md

The layers are tests/test_layers.py's (the test that keeps the arrows pointing down), and
every count comes from reading every import statement of src/selfattn, so the picture
changes when the code does. The docs tests run this script and fail when
docs/architecture.md holds another picture than the one it draws today.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

DOCS = Path(__file__).resolve().parent
PAGE = DOCS / "architecture.md"
BEGIN, END = "<!-- the house: made by docs/make_architecture.py -->", "<!-- end of the house -->"
sys.path.insert(0, str(DOCS.parent / "tests"))

from test_layers import GRAPH, LAYERS, MODULES, TOP, layer_of  # noqa: E402

WIDTH = 78


def members(layer: str) -> list[str]:
    """The layer's packages (with their module count) and single modules, as the code names them."""
    counts = Counter()
    for module in MODULES:
        if module != TOP and layer_of(module) == layer:
            parts = module.split(".")
            counts[parts[1] + ("/" if MODULES["selfattn." + parts[1]][1] else ".py")] += 1
    return [f"{name} ({n})" if name.endswith("/") else name for name, n in sorted(counts.items())]


def arrows(layer: str) -> Counter:
    """How many module-to-module imports go from ``layer`` to each other layer."""
    found = Counter()
    for module, targets in GRAPH.items():
        if module != TOP and layer_of(module) == layer:
            found.update(layer_of(t) for t in targets if t != TOP and layer_of(t) != layer)
    return found


def box(title: str, items: list[str]) -> list[str]:
    """A box of WIDTH holding the title, then the items, wrapped."""
    inner = WIDTH - 4
    lines = [title]
    for item in items:
        if len(lines[-1]) + 2 + len(item) > inner:
            lines.append("   " + item)
        else:
            lines[-1] += "  " + item
    return ["┌" + "─" * (WIDTH - 2) + "┐", *[f"│ {line:<{inner}} │" for line in lines], "└" + "─" * (WIDTH - 2) + "┘"]


def picture() -> str:
    names = list(LAYERS)
    out = []
    for i, layer in enumerate(names):
        out += box(f"{layer}  ({sum(1 for m in MODULES if m != TOP and layer_of(m) == layer)} modules)", members(layer))
        if i + 1 < len(names):
            below = arrows(layer)
            spread = ", ".join(f"{names[j]} {below[names[j]]}" for j in range(i + 1, len(names)) if below[names[j]])
            out.append(f"        │  imports down: {spread or 'none'}")
            out.append("        ▼")
    return "\n".join(out)


def block() -> str:
    return f"{BEGIN}\n```text\n{picture()}\n```\n{END}"


def page_block(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        text = PAGE.read_text(encoding="utf-8")
        PAGE.write_text(text.replace(page_block(text), block()), encoding="utf-8")
        print(f"wrote the picture into {PAGE}")
    else:
        print(picture())
