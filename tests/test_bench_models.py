"""bench/models.py runs end to end on tiny models and both sides do the same work in every part.

``--quick --small`` (width 64, 6 layers, Gemma 3's window 16, one round) proves the script
works; its times mean nothing and are not checked. What is checked: exit status 0, one row
per measurement of every part in the JSON, the greedy ids of ours and transformers equal
(llama and stories260K, exactly N tokens each), the forward's logits close to
transformers' (llama, qwen3, gemma3), the ratios computed from the medians, and ``--only``
refusing an unknown part with exit status 2.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "bench/models.py"


def run_script(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *arguments], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)


def test_every_part_on_tiny_models_does_the_same_work(tmp_path):
    out = tmp_path / "models.json"
    done = run_script("--quick", "--small", "--rounds", "1", "--gen-rounds", "1", "--tokens", "48",
                      "--new-tokens", "12", "--story-tokens", "40", "--threads", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {(r["part"], r["kind"]): r for r in result["rows"]}
    assert set(rows) == {("llama", "forward"), ("llama", "generate"), ("stories260K", "generate"),
                         ("qwen3", "forward"), ("gemma3", "forward"),
                         ("smollm2", "load"), ("smollm2", "forward"), ("smollm2", "generate"), ("smollm2", "memory")}
    for (part, kind), row in rows.items():
        assert row["rounds"] == 1 and row["ours"] > 0 and row["theirs"] > 0, row
        assert math.isclose(row["ratio"], row["ours"] / row["theirs"]), row
        assert row["target"] == {"forward": 1.1, "generate": 1.2, "load": 0.5, "memory": 1.2}[kind], row
        if kind == "memory":
            assert 50 < row["theirs"] < 5000 and row["check"].startswith("loaded: ours"), row  # megabytes
        elif kind == "load":
            assert row["check"].startswith("tiny.gguf"), row  # --small: a tiny GGUF written by the script
        elif kind == "generate":
            new = 40 if part == "stories260K" else 12
            assert row["same"]["made"] == [new, new] and row["same"]["ids_same"], row
        else:
            # float32 on both sides; ours takes RoPE's angles in float64, transformers in float32
            assert row["same"]["max_diff"] < 1e-3, row
            assert row["same"]["logits_max"] > 1.0, row  # logits far from zero: the check has teeth
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # the header starts with the CPU's name: ratios differ between Intel and AMD
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        assert not names or result["header"].startswith(names[0] + " ("), result["header"]  # bench/machine.py's line


def test_only_runs_the_parts_named_and_refuses_unknown_ones(tmp_path):
    out = tmp_path / "stories.json"
    done = run_script("--only", "stories260K", "--story-tokens", "8", "--gen-rounds", "1", "--threads", "1",
                      "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["part"], r["same"]["ids_same"]) for r in rows] == [("stories260K", True)]
    assert "tokens/s" in done.stdout
    bad = run_script("--only", "llama,gpt5")
    assert bad.returncode == 2 and "unknown part 'gpt5'" in bad.stderr
