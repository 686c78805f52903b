"""The house move's guard (issues 27 and 45): record the CLI's outputs before a move, compare after.

    .venv/bin/python tools/golden.py record   # writes tools/golden/*.out (before the first move)
    .venv/bin/python tools/golden.py check    # runs the same commands, reports every difference

JSON outputs are compared key by key (a new key is fine, a missing or changed one is not;
numbers to 1e-9 relative, so another CPU's last-bit rounding shows as a note, not a
failure). Text, markdown and pages are compared line by line. Not a test: a test must not
compare the code with its own earlier output; this only guards a refactor that must not
change what users see. Decoder folders come from tests/tiny_models.py (transformers).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STORE = HERE / "golden"
MODELS = Path(os.environ.get("GOLDEN_MODELS", "/tmp/golden-models"))
SELFATTN = [str(ROOT / ".venv/bin/selfattn")]
SEED = "The cat sat on the warm mat"

# Source folders moved by issue 45; a page's comment names its data's docstring by path.
MOVED = [("selfattn/viz/", "selfattn/render/visual/"), ("selfattn/explain/", "selfattn/render/text/")]

RUNS: dict[str, list[str]] = {
    "explain-seed": ["explain", "--format", "json"],
    "explain-seed-text": ["explain"],
    "explain-seed-md": ["explain", "--format", "markdown"],
    "explain-query-the": ["explain", "--query", "the", "--precision", "6", "--format", "json"],
    "explain-random": ["explain", "the cat saw the dog", "--query", "3", "--embed", "random", "--dim", "4", "--format", "json"],
    "explain-scaled": ["explain", "--variant", "scaled", "--format", "json"],
    "explain-qkv": ["explain", "--variant", "qkv", "--format", "json"],
    "explain-qkv-wide": ["explain", "--variant", "qkv", "--embed", "random", "--dim", "64", "--d-k", "64", "--format", "json"],
    "explain-causal": ["explain", "--variant", "causal", "--query", "sat", "--format", "json"],
    "explain-causal-text": ["explain", "--variant", "causal", "--query", "sat"],
    "explain-causal-md": ["explain", "--variant", "causal", "--format", "markdown"],
    "explain-multihead": ["explain", "--variant", "multihead", "--heads", "2", "--format", "json"],
    "explain-multihead-text": ["explain", "--variant", "multihead", "--heads", "2"],
    "explain-gqa": ["explain", "--variant", "gqa", "--heads", "4", "--kv-heads", "2", "--format", "json"],
    "explain-gqa-rope": ["explain", "--variant", "gqa", "--heads", "4", "--kv-heads", "2", "--positional", "rope", "--format", "json"],
    "explain-flash": ["explain", "--variant", "flash", "--format", "json"],
    "explain-flash-text": ["explain", "--variant", "flash", "--block-size", "3"],
    "explain-flash-b3": ["explain", "--variant", "flash", "--block-size", "3", "--format", "json"],
    "explain-sinusoidal": ["explain", "--positional", "sinusoidal", "--format", "json"],
    "explain-learned": ["explain", "--variant", "qkv", "--positional", "learned", "--format", "json"],
    "explain-rope": ["explain", "--variant", "causal", "--positional", "rope", "--format", "json"],
    "explain-alibi": ["explain", "--variant", "causal", "--positional", "alibi", "--format", "json"],
    "explain-rope-text": ["explain", "--variant", "qkv", "--positional", "rope"],
    "explain-minilm": ["explain", "--model", "all-MiniLM-L6-v2", "--layer", "2", "--head", "5", "--query", "cat", "--format", "json"],
    "explain-minilm-text": ["explain", "--model", "all-MiniLM-L6-v2", "--layer", "2", "--head", "5", "--query", "cat"],
    "explain-minilm-md": ["explain", "--model", "all-MiniLM-L6-v2", "--format", "markdown"],
    "explain-induction": ["explain", "--model", "tiny-induction", "--layer", "1", "--head", "2", "--format", "json"],
    "explain-shakespeare-text": ["explain", "--model", "tiny-shakespeare", "ROMEO: the cat", "--layer", "1", "--head", "0"],
    "heads-default": ["heads", "--format", "json"],
    "heads-text": ["heads"],
    "heads-sentence": ["heads", "The cat sat on the warm mat because it was tired", "--format", "json"],
    "heads-induction-probe": ["heads", "--model", "tiny-induction", "--probe", "induction", "--format", "json"],
    "heads-induction-probe-text": ["heads", "--model", "tiny-induction", "--probe", "induction"],
    "heads-shakespeare": ["heads", "--model", "tiny-shakespeare", "the cat sat, the cat ran", "--format", "json"],
    "similarity": ["similarity", "The cat sat on the mat", "A kitten rested on the rug", "Stocks fell sharply", "--format", "json"],
    "similarity-text": ["similarity", "The cat sat on the mat", "A kitten rested on the rug"],
    "compare-seed": ["compare", "I sat by the river bank", "I paid at the bank", "--query", "bank", "--format", "json"],
    "compare-minilm": ["compare", "I sat by the river bank", "I paid at the bank", "--query", "bank", "--model", "all-MiniLM-L6-v2", "--format", "json"],
    "compare-minilm-text": ["compare", "I sat by the river bank", "I paid at the bank", "--query", "bank", "--model", "all-MiniLM-L6-v2"],
    "compare-multihead": ["compare", "the cat saw the dog", "a dog saw the cat", "--query", "cat", "--variant", "multihead", "--dim", "8", "--format", "json"],
    "compare-position": ["compare", "the cat sat", "the cat ran", "--query", "1", "--format", "json"],
    "compare-induction": ["compare", "the cat sat", "the dog sat", "--query", "sat", "--model", "tiny-shakespeare", "--format", "json"],
    "generate-shakespeare": ["generate", "ROMEO:", "--model", "tiny-shakespeare", "--max-new-tokens", "30", "--format", "json"],
    "generate-shakespeare-text": ["generate", "ROMEO:", "--model", "tiny-shakespeare", "--max-new-tokens", "30"],
    "generate-sampled": ["generate", "ROMEO:", "--model", "tiny-shakespeare", "--temperature", "0.8", "--top-p", "0.9", "--top-k", "20", "--seed", "1", "--format", "json"],
    "generate-induction": ["generate", "a b c d a b", "--model", "tiny-induction", "--max-new-tokens", "5", "--format", "json"],
    # added for issue 45: the commands and models that came after the first pass
    "explain-stories": ["explain", "--model", "stories260K", "Once upon a time", "--layer", "2", "--head", "3", "--format", "json"],
    "generate-stories": ["generate", "Once upon a time", "--model", "stories260K", "--max-new-tokens", "20", "--format", "json"],
    "generate-stories-text": ["generate", "Once upon a time", "--model", "stories260K", "--max-new-tokens", "20"],
    "explain-smollm2": ["explain", "--model", "SmolLM2-135M-Instruct", "--layer", "3", "--head", "2", "--format", "json"],
    "generate-smollm2": ["generate", "The cat sat on the", "--model", "SmolLM2-135M-Instruct", "--max-new-tokens", "6", "--format", "json"],
    "heads-smollm2": ["heads", "--model", "SmolLM2-135M-Instruct", "the cat sat, the cat ran", "--format", "json"],
    "ablate-induction": ["ablate", "--model", "tiny-induction", "--probe", "induction", "--heads", "1.2,1.0", "--format", "json"],
    "ablate-induction-text": ["ablate", "--model", "tiny-induction", "--probe", "induction", "--heads", "1.2"],
    "ablate-mean": ["ablate", "ROMEO: the cat", "--model", "tiny-shakespeare", "--heads", "0.1", "--mode", "mean", "--format", "json"],
    "ablate-generate": ["ablate", "a b c d a b", "--model", "tiny-induction", "--heads", "1.2", "--generate", "4", "--format", "json"],
    "patch-induction": ["patch", "a b c d e f a b c d", "a j c d e f a b c d", "--model", "tiny-induction", "--target", "e", "--format", "json"],
    "patch-induction-text": ["patch", "a b c d e f a b c d", "a j c d e f a b c d", "--model", "tiny-induction", "--target", "e"],
    "patch-path": ["patch", "a b c d e f a b c d", "a j c d e f a b c d", "--model", "tiny-induction", "--target", "e",
                   "--senders", "0.2,0.3", "--receivers", "1.0,1.1,1.2,1.3", "--via", "k", "--format", "json"],
    "attribute-induction": ["attribute", "a b c d e f a b c d", "--model", "tiny-induction", "--target", "e", "--format", "json"],
    "attribute-induction-text": ["attribute", "a b c d e f a b c d", "--model", "tiny-induction", "--target", "e"],
    "heads-composition": ["heads", "--model", "tiny-induction", "--composition", "--format", "json"],
    "explain-error-variant": ["explain", "--variant", "nope"],
    "explain-error-model": ["explain", "--model", "/nonexistent/model"],
}
FAMILY_RUNS = {
    "explain-{f}": ["explain", "--model", "{dir}", "The cat sat on the warm mat", "--layer", "1", "--head", "1", "--format", "json"],
    "explain-{f}-text": ["explain", "--model", "{dir}", "The cat sat on the warm mat", "--layer", "1", "--head", "1"],
    "heads-{f}": ["heads", "--model", "{dir}", "the cat sat, the cat ran", "--format", "json"],
    "heads-{f}-probe": ["heads", "--model", "{dir}", "--probe", "induction", "--probe-length", "12", "--format", "json"],
    "generate-{f}": ["generate", "The cat", "--model", "{dir}", "--max-new-tokens", "8", "--format", "json"],
    "compare-{f}": ["compare", "the cat sat", "the dog sat", "--query", "2", "--model", "{dir}", "--format", "json"],
    "attribute-{f}": ["attribute", "the cat sat, the cat", "--model", "{dir}", "--target", "3", "--format", "json"],
    "ablate-{f}": ["ablate", "the cat sat, the cat ran", "--model", "{dir}", "--heads", "1.0,0.1", "--format", "json"],
}
PAGES = {
    "view-seed": ["view"],
    "view-gqa": ["view", "--variant", "gqa", "--heads", "4", "--kv-heads", "2", "--positional", "rope"],
    "view-flash": ["view", "--variant", "flash"],
    "view-minilm": ["view", "--model", "all-MiniLM-L6-v2", "--layer", "2", "--head", "5"],
    "view-induction": ["view", "--model", "tiny-induction"],
    "view-llama": ["view", "--model", "{llama}"],
}


def family_folders() -> dict[str, Path]:
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import DECODERS, tiny_checkpoint

    folders = {}
    for family in (*DECODERS, "bert"):
        folder = MODELS / family
        if not (folder / "config.json").exists():
            folder.mkdir(parents=True, exist_ok=True)
            tiny_checkpoint(family, folder)
        folders[family] = folder
    return folders


def all_runs() -> dict[str, list[str]]:
    runs = dict(RUNS)
    folders = family_folders()
    for family, folder in folders.items():
        for name, args in FAMILY_RUNS.items():
            if family == "bert" and any(word in name for word in ("generate", "probe", "attribute", "ablate")):
                continue
            runs[name.format(f=family)] = [a.format(dir=folder) for a in args]
    for name, args in PAGES.items():
        runs[name] = [a.format(llama=folders["llama"]) for a in args]
    return runs


def run(name: str, args: list[str], tmp: Path) -> str:
    if args[0] == "view":
        page = tmp / f"{name}.html"
        args = [*args, "-o", str(page)]
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1", TERM="dumb")
    done = subprocess.run(SELFATTN + args, capture_output=True, text=True, env=env, cwd=tmp)
    text = f"exit {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    if args[0] == "view" and done.returncode == 0:
        text += "--- page\n" + page.read_text()
    return text


def differences(name: str, before: str, after: str) -> list[str]:
    before, after = (re.sub(r"wrote /tmp/[^/\s]+/", "wrote ", text) for text in (before, after))  # the run's own folder
    for moved, now in MOVED:  # a source path a page names in a comment, moved on purpose
        before = before.replace(moved, now)
    if before == after:
        return []
    b_out, a_out = (part(t, "stdout") for t in (before, after))
    try:
        old, new = json.loads(b_out), json.loads(a_out)
    except ValueError:
        old = new = None
    if old is not None:
        found: list[str] = []
        compare_json(old, new, name, found)
        rest_b, rest_a = before.replace(b_out, ""), after.replace(a_out, "")
        if rest_b != rest_a:
            found.append(f"{name}: exit status or stderr differ")
        if not found and b_out != a_out:
            found.append(f"{name}: the same keys and values, in another order or layout")
        return found
    lines = [f"{name}: line {i}: {x!r} -> {y!r}" for i, (x, y) in enumerate(zip(before.splitlines(), after.splitlines())) if x != y]
    if len(before.splitlines()) != len(after.splitlines()):
        lines.append(f"{name}: {len(before.splitlines())} lines -> {len(after.splitlines())}")
    return lines[:20]


def part(text: str, which: str) -> str:
    start = text.index(f"--- {which}\n") + len(f"--- {which}\n")
    end = text.index("--- stderr\n")
    return text[start:end]


def compare_json(old, new, path: str, found: list[str]) -> None:
    if isinstance(old, dict):
        if not isinstance(new, dict):
            found.append(f"{path}: was an object")
            return
        for key in old:
            if key not in new:
                found.append(f"{path}.{key}: missing")
            else:
                compare_json(old[key], new[key], f"{path}.{key}", found)
    elif isinstance(old, list):
        if not isinstance(new, list) or len(new) != len(old):
            found.append(f"{path}: list length or type changed")
            return
        for i, (x, y) in enumerate(zip(old, new)):
            compare_json(x, y, f"{path}[{i}]", found)
    elif isinstance(old, float) and isinstance(new, (int, float)) and not isinstance(new, bool):
        if abs(old - new) > 1e-9 * max(1.0, abs(old)):
            found.append(f"{path}: {old!r} -> {new!r}")
    elif old != new or type(old) is not type(new):
        found.append(f"{path}: {old!r} -> {new!r}")


def main(mode: str, only: list[str]) -> int:
    import tempfile

    runs = all_runs()
    names = [n for n in runs if not only or any(o in n for o in only)]
    STORE.mkdir(exist_ok=True)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            out = run(name, runs[name], Path(tmp))
            stored = STORE / f"{name}.out"
            if mode == "record":
                stored.write_text(out)
                print(f"recorded {name} ({out.splitlines()[0]})")
                continue
            found = differences(name, stored.read_text(), out)
            failures += bool(found)
            print(f"{'DIFF' if found else 'same'} {name}")
            for line in found[:20]:
                print("    " + line)
    if mode == "check":
        print(f"{failures} of {len(names)} differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
