"""Every public name documents itself in Google style, the style the API reference renders.

"Public" is what ``selfattn.__all__``, ``selfattn.masks.__all__`` and
``selfattn.distributed.__all__`` export. Functions and methods name every parameter of
their signature in ``Args:`` and say what they give back in ``Returns:`` (or
``Yields:``); classes document their constructor's parameters (``Args:`` or, for
dataclasses and named tuples, ``Attributes:``). The sections are read by griffe, the
parser mkdocstrings uses, so a section it cannot read fails here too.
"""

from __future__ import annotations

import dataclasses
import doctest
import inspect

import pytest

import selfattn
from selfattn import distributed, masks

griffe = pytest.importorskip("griffe", reason="the docs tools are not installed: pip install -e '.[docs]'")

MODULES = (selfattn, masks, distributed)
PUBLIC = sorted({f"{module.__name__}.{name}" for module in MODULES for name in module.__all__})


def public_object(path: str):
    module, _, name = path.rpartition(".")
    return getattr(next(m for m in MODULES if m.__name__ == module), name)


CALLABLES = [p for p in PUBLIC if inspect.isfunction(public_object(p))]
CLASSES = [p for p in PUBLIC if inspect.isclass(public_object(p))]


def sections(obj) -> dict[str, list]:
    """Section kind -> parsed items, as mkdocstrings will see them."""
    text = inspect.getdoc(obj) or ""
    parsed = griffe.Docstring(text).parse("google", warn_missing_types=False)
    found: dict[str, list] = {}
    for section in parsed:
        value = section.value if isinstance(section.value, list) else [section.value]
        found.setdefault(section.kind.value, []).extend(value)
    return found


def documented_names(found: dict[str, list], *kinds: str) -> set[str]:
    return {item.name.lstrip("*") for kind in kinds for item in found.get(kind, [])}


def parameters(function) -> list[str]:
    skip = {"self", "cls"}
    return [name for name in inspect.signature(function).parameters if name not in skip]


def returns_nothing(function) -> bool:
    annotation = inspect.signature(function).return_annotation
    return annotation in (None, "None")


def check_function(function, where: str) -> list[str]:
    problems = []
    found = sections(function)
    if not found.get("text"):
        problems.append(f"{where}: no summary line")
    missing = [p for p in parameters(function) if p not in documented_names(found, "parameters", "other parameters")]
    if missing:
        problems.append(f"{where}: Args does not name {', '.join(missing)}")
    if not returns_nothing(function) and not (found.get("returns") or found.get("yields")):
        problems.append(f"{where}: no Returns section")
    return problems


@pytest.mark.parametrize("path", CALLABLES)
def test_functions_document_arguments_and_return(path):
    problems = check_function(public_object(path), path)
    assert not problems, "\n".join(problems)


def own_methods(cls):
    """Public methods and properties written in this class, except torch's hooks it fills in (extra_repr)."""
    foreign = {name for base in cls.__mro__[1:] if not base.__module__.startswith("selfattn") for name in vars(base)}
    for name, member in vars(cls).items():
        if name.startswith("_") or (name in foreign and name != "forward"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            yield name, member.__func__
        elif inspect.isfunction(member) or isinstance(member, property):
            yield name, member


def constructor_parameters(cls) -> list[str]:
    if issubclass(cls, BaseException):
        return []  # the message, as every exception
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init]
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return list(cls._fields)
    init = cls.__dict__.get("__init__")
    return parameters(init) if init is not None else []


@pytest.mark.parametrize("path", CLASSES)
def test_classes_document_constructor_and_methods(path):
    cls = public_object(path)
    found = sections(cls)
    problems = [] if found.get("text") else [f"{path}: no summary line"]
    init = cls.__dict__.get("__init__")
    init_found = sections(init) if inspect.isfunction(init) else {}
    known = documented_names(found, "parameters", "attributes", "other parameters") | documented_names(init_found, "parameters")
    missing = [p for p in constructor_parameters(cls) if p not in known]
    if missing:
        problems.append(f"{path}: the class or its __init__ does not document {', '.join(missing)}")
    for name, member in own_methods(cls):
        if isinstance(member, property):
            if not inspect.getdoc(member):
                problems.append(f"{path}.{name}: property without a docstring")
        else:
            problems.extend(check_function(member, f"{path}.{name}"))
    assert not problems, "\n".join(problems)


def test_the_checker_sees_what_is_missing():
    """The checks above fail on a docstring that leaves things out."""

    def half_documented(query, key, scale=None):
        """Attention.

        Args:
            query: (..., q_len, d) queries.
        """
        return query

    problems = check_function(half_documented, "f")
    assert problems == ["f: Args does not name key, scale", "f: no Returns section"]


def test_docstring_examples_run():
    """Examples in docstrings (``>>>`` lines) print what they show."""
    finder, runner = doctest.DocTestFinder(exclude_empty=True), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    examples = 0
    for path in PUBLIC:
        obj = public_object(path)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        for test in finder.find(obj, path, globs={"sa": selfattn, "torch": pytest.importorskip("torch")}):
            examples += len(test.examples)
            runner.run(test)
    assert examples >= 5, "the public API should show at least a few runnable examples"
    assert runner.failures == 0, f"{runner.failures} docstring examples printed something else (see the output above)"


def test_package_docstring_is_a_short_map_that_says_where_the_reference_is():
    doc = selfattn.__doc__
    assert len(doc.strip().splitlines()) <= 40
    assert "docs/reference" in doc or "API reference" in doc
    for name in ("explain", "scaled_dot_product_attention", "flash_attention", "MultiHeadAttention", "load_pretrained", "ring_attention"):
        assert name in doc, name
