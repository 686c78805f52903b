"""The house's arrows, read from every import statement of src/selfattn.

Every ``import`` and ``from ... import`` counts, at module level, inside functions and
under ``TYPE_CHECKING`` alike: an import inside a function is still an arrow between two
modules, and hiding a cycle in one is how cycles grew before. ``from package import name``
counts as an arrow to the package too (its ``__init__`` runs first and may import back).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest


SRC = Path(__file__).resolve().parents[1] / "src"


def modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package)."""
    found = {}
    for path in sorted((SRC / "selfattn").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


MODULES = modules()


def owner(name: str) -> str | None:
    """The module that ``name`` (a module or a module.attribute) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Every selfattn module that ``module`` imports, anywhere in its file."""
    path, package = MODULES[module]
    here = module if package else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets |= {owner(alias.name) for alias in node.names if alias.name.split(".")[0] == "selfattn"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "selfattn":
                continue
            targets.add(owner(source))
            targets |= {f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in MODULES}
    return targets - {None, module}


GRAPH = {module: imports_of(module) for module in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_reader_sees_function_level_imports():
    """A cycle hidden in a function is found: the reader is checked on a graph made up here."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert "selfattn.errors" in GRAPH["selfattn.checks"]  # a module-level import, read


# The house, top to bottom: a module may import its own layer and the layers below, never above.
LAYERS = {
    "cli": ("selfattn.cli", "selfattn.__main__"),
    "app": ("selfattn.serve",),
    "commands": ("selfattn.commands",),
    "renderers": ("selfattn.render",),
    "training": ("selfattn.training",),
    "analysis": ("selfattn.analysis",),
    "trace": ("selfattn.trace",),
    "models": ("selfattn.models",),
    "integrations": ("selfattn.integrations",),
    "distributed": ("selfattn.distributed",),
    "attention": ("selfattn.attention",),
    "kernels": ("selfattn.kernels",),
    "leaves": ("selfattn.masks", "selfattn.pipeline", "selfattn.positional", "selfattn.checks", "selfattn.errors",
               "selfattn.formatting", "selfattn.renamed", "selfattn.peak_memory", "selfattn.lazy"),
}
ORDER = list(LAYERS)  # top first
TOP = "selfattn"  # the package itself: the lazy public API, above everything
# What a renderer may never import: anything that loads a model by name or reads its files, and
# the training package but for its records (a run's metrics and probe, as the commands read them).
LOADERS = ("selfattn.models.loading", "selfattn.models.pretrained", "selfattn.models.checkpoint",
           "selfattn.models.files", "selfattn.models.families", "selfattn.models.registry")
TRAINING_RECORDS = ("selfattn.training.records", "selfattn.training.settings")


def placed(module: str) -> str | None:
    """The layer ``module`` belongs to, or None when it is in none."""
    return next((name for name, prefixes in LAYERS.items()
                 if any(module == p or module.startswith(p + ".") for p in prefixes)), None)


def layer_of(module: str) -> str:
    name = placed(module)
    if name is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to docs/architecture.md)")
    return name


def test_every_module_has_a_layer():
    unplaced = [module for module in MODULES if module != TOP and placed(module) is None]
    assert unplaced == [], f"modules in no layer (add them to LAYERS and to docs/architecture.md): {unplaced}"
    assert placed("selfattn.somewhere_new") is None and placed("selfattn.commands.new_command") == "commands"


def test_imports_point_down():
    upward = [
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, targets in GRAPH.items() if module != TOP
        for target in sorted(targets) if target != TOP and ORDER.index(layer_of(target)) < ORDER.index(layer_of(module))
    ]
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_renderers_never_load_or_train():
    found = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items() if module != TOP and layer_of(module) == "renderers"
        for target in sorted(targets)
        if target.startswith(LOADERS) or (target.startswith("selfattn.training") and not target.startswith(TRAINING_RECORDS))
    ]
    assert not found, "renderers that load or train:\n" + "\n".join(found)


def test_records_never_import_a_renderer():
    """The trace layer and everything below it hold plain data: no import of render/text/, render/visual/, the commands or the CLI."""
    below = ORDER[ORDER.index("training"):]
    found = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items() if module != TOP and layer_of(module) in below
        for target in sorted(targets) if target != TOP and layer_of(target) in ("renderers", "commands", "cli")
    ]
    assert not found, "\n".join(found)


def test_the_rules_catch_an_upward_import(monkeypatch):
    """The layer tests fail on a made-up upward import and a made-up loading renderer."""
    graph = dict(GRAPH)
    graph["selfattn.trace.seed"] = GRAPH["selfattn.trace.seed"] | {"selfattn.render.visual.explorer"}
    graph["selfattn.render.visual.explorer"] = GRAPH["selfattn.render.visual.explorer"] | {"selfattn.models.loading"}
    monkeypatch.setattr(__import__(__name__), "GRAPH", graph)
    with pytest.raises(AssertionError, match="trace.seed"):
        test_imports_point_down()
    with pytest.raises(AssertionError, match="models.loading"):
        test_renderers_never_load_or_train()
    with pytest.raises(AssertionError, match="visual.explorer"):
        test_records_never_import_a_renderer()


def test_no_import_cycle():
    found = cycles(GRAPH)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
