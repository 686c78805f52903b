"""The code blocks of the README and the docs pages, as things a test can run.

Fences by language:
- ``python``: run in order, one namespace per page. A bare expression whose comment
  starts with a Python literal (``probs.shape  # (1, 2, 3, 4096)``, ``len(tiles)  # 22``)
  claims a value: the test compares it (a tensor's shape against a tuple).
  A block whose fence names torchrun (``python title="...: torchrun ..."``) runs under
  torchrun instead (tests/test_docs.py).
- ``sh``: every line that starts with ``selfattn `` is a command to run; anything else
  (make, pip, torchrun, benchmarks) is not run here.
- ``console``: ``$ selfattn ...`` lines followed by an excerpt of what they print; the
  excerpt's lines must appear in that order in the real output (spaces collapsed), a
  line ``...`` standing for lines left out.
- Commands in code spans of the prose and tables (`` `selfattn explain --variant causal` ``)
  run too, unless they are a bare command name (`` `selfattn plot` ``) or hold a placeholder (``FILE``, ``[SENTENCE]``, ``a | b``).
- ``json title="NAME.json"`` (or any fence with a title naming a file, outside python):
  a file the page asks the reader to save; the tests write it into the folder the
  commands run in, so a command that reads ``NAME.json`` reads exactly what the page shows.
- ``python title="makes NAME/"``: a script that makes the folder NAME (a small model to
  try things on). It runs once per test session; every command of every page then runs
  beside a copy of that folder, so ``--model NAME`` finds it, as it would for a reader who
  ran the script first.
- ``text`` and anything else: shown, not run (benchmark tables, outputs of long runs).
"""

from __future__ import annotations

import ast
import io
import re
import shlex
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```([\w-]*)([^\n]*)\n(.*?)^\1```", re.M | re.S)  # also indented, in a list


@dataclass(frozen=True)
class Block:
    page: str  # the page's path relative to the repository
    language: str
    info: str  # what follows the language on the fence line
    body: str
    line: int  # the fence's line number in the page


def blocks(page: Path, language: str | None = None) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        block = Block(str(page.relative_to(ROOT)), match.group(2), match.group(3).strip(), textwrap.dedent(match.group(4)),
                      text.count("\n", 0, match.start()) + 1)
        if language is None or block.language == language:
            found.append(block)
    return found


SAVED_AS = re.compile(r'title="([\w.-]+\.\w+)"')
MAKES = re.compile(r'title="makes ([\w.-]+)/"')


def setup_scripts() -> dict[str, Block]:
    """{folder name: the python block that makes it}, over all the pages."""
    scripts: dict[str, Block] = {}
    for page in PAGES:
        for block in blocks(page, "python"):
            made = MAKES.fullmatch(block.info)
            if made:
                assert made.group(1) not in scripts, f"{block.page}:{block.line}: two pages make {made.group(1)}"
                scripts[made.group(1)] = block
    return scripts


def saved_files() -> dict[str, str]:
    """{file name: contents} of every block that asks the reader to save it, over all the pages."""
    files: dict[str, str] = {}
    for page in PAGES:
        for block in blocks(page):
            name = SAVED_AS.fullmatch(block.info)
            if name and block.language not in ("python", "sh", "console"):
                assert name.group(1) not in files, f"{block.page}:{block.line}: two pages save {name.group(1)}"
                files[name.group(1)] = block.body
    return files


def shell_commands(block: Block) -> list[list[str]]:
    """The ``selfattn`` commands of an sh block, as argument lists without the program name.

    A comment ends the command; ``> FILE`` (the output sent to a file) is left off, as the
    test reads the output itself.
    """
    commands = []
    for line in block.body.splitlines():
        if not line.startswith("selfattn "):
            continue
        words = shlex.split(line, comments=True)
        if ">" in words:
            words = words[: words.index(">")]
        commands.append(words[1:])
    return commands


PLACEHOLDER = re.compile(r"\b[A-Z]{3,}\b|[\[|]|\.\.\.")  # FILE, KIND, [SENTENCE], a | b: usage, not a command


def inline_commands(page: Path) -> list[list[str]]:
    """``selfattn ...`` commands written in the prose and tables (code spans), placeholders aside."""
    prose = FENCE.sub("", page.read_text())
    commands = []
    for span in re.findall(r"`(selfattn [^`]+)`", prose):
        args = shlex.split(span)[1:]
        if len(args) > 1 and not PLACEHOLDER.search(span):  # `selfattn plot` alone names the command
            commands.append(args)
    return commands


def console_sessions(block: Block) -> list[tuple[list[str], list[str]]]:
    """(arguments, the excerpt's lines) for every ``$ selfattn ...`` of a console block."""
    sessions: list[tuple[list[str], list[str]]] = []
    for line in block.body.splitlines():
        if line.startswith("$ "):
            words = shlex.split(line[2:], comments=True)
            assert words[0] == "selfattn", f"{block.page}:{block.line}: a console block runs selfattn only"
            sessions.append((words[1:], []))
        elif sessions:
            sessions[-1][1].append(line)
    return sessions


def squeeze(line: str) -> str:
    return " ".join(line.split())


def missing_from_output(excerpt: list[str], output: str) -> list[str]:
    """The excerpt's lines that are not found, in order, in the output ([] when all are)."""
    lines = [squeeze(line) for line in output.splitlines()]
    position, missing = 0, []
    for wanted in (squeeze(line) for line in excerpt):
        if not wanted or wanted == "...":
            continue
        try:
            position = lines.index(wanted, position) + 1
        except ValueError:
            missing.append(wanted)
    return missing


def claimed_values(source: str) -> dict[int, object]:
    """Line number -> the literal a comment claims for the bare expression on that line."""
    comments = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    claims = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and node.end_lineno in comments:
            claim = leading_literal(comments[node.end_lineno])
            if claim is not None:
                claims[node.end_lineno] = claim
    return claims


def leading_literal(comment: str):
    """The Python literal a comment starts with ('(1, 2, 3): rows' -> (1, 2, 3)), else None.

    The literal ends where a word, a comma, a colon or a semicolon follows it, or at the end.
    """
    ends = [i for i, c in enumerate(comment) if c in " ,:;"] + [len(comment)]
    for end in sorted(ends, reverse=True):
        text = comment[:end]
        if not text or text.endswith(","):
            continue
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        return value if isinstance(value, (int, float, tuple, list, bool)) and "..." not in text else None
    return None


def matches_claim(value, claim) -> bool:
    if hasattr(value, "shape") and isinstance(claim, tuple):
        return tuple(value.shape) == claim
    if isinstance(claim, tuple) and isinstance(value, (tuple, list)):
        return tuple(value) == claim
    return value == claim


def run_python(source: str, filename: str, namespace: dict) -> list[str]:
    """Run ``source`` statement by statement; returns the claims that did not hold."""
    claims = claimed_values(source)
    failed = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and node.end_lineno in claims:
            value = eval(compile(ast.Expression(node.value), filename, "eval"), namespace)  # noqa: S307 - our docs
            if not matches_claim(value, claims[node.end_lineno]):
                shown = f"of shape {tuple(value.shape)}" if hasattr(value, "shape") else repr(value)[:200]
                failed.append(f"{filename}:{node.lineno}: {ast.unparse(node)} is {shown}, the page says {claims[node.end_lineno]!r}")
        else:
            exec(compile(ast.Module([node], []), filename, "exec"), namespace)  # noqa: S102 - our docs
    return failed
