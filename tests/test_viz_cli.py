"""`selfattn plot` and `selfattn view` end to end: the files they write, and every refusal."""

import html
import json
import math
import os
import re
import struct
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seed_reference import ALL_SCORES, CAT_WEIGHTS, TOKENS
import selfattn as sa
from selfattn import ExplainConfig, build_trace
from selfattn.render.text.json_out import render_json
from selfattn.masks import EMPTY, FULL, PARTIAL

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    width, height = struct.unpack(">II", data[16:24])
    assert width > 200 and height > 200
    return width, height


def svg_texts(path) -> list[str]:
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    return ["".join(node.itertext()) for node in root.iter() if node.tag.endswith("text")]


def assert_only(folder, names):
    """The folder holds exactly these files: no partial or temporary file was left behind."""
    assert sorted(os.listdir(folder)) == sorted(names)


@pytest.mark.parametrize(
    "args",
    [
        ["--kind", "heatmap"],
        ["--kind", "arrows", "--query", "cat"],
        ["--kind", "heads", "--variant", "multihead", "--heads", "3"],
        ["--kind", "mask", "--variant", "causal"],
        ["--kind", "mask", "--mask", "causal-bottom-right:2"],
        ["--kind", "mask", "--mask", "sliding-window:2"],
        ["--kind", "mask", "--mask", "padding:5"],
        ["--kind", "mask", "--mask", "documents:3,4", "--tile", "3"],
        ["--kind", "mask", "--mask", "documents:2x2,3"],
        ["--kind", "mask", "--mask", "prefix-lm:3"],
        ["--kind", "positional"],
        ["--kind", "positional", "--positional", "rope", "--dim", "16"],
        ["--kind", "rope-distance"],
        ["--kind", "rope-distance", "--variant", "gqa", "--heads", "4", "--embed", "random", "--dim", "8", "--head", "3"],
    ],
)
def test_every_kind_writes_png_and_svg(run_cli, tmp_path, args):
    for suffix in (".png", ".svg"):
        path = tmp_path / f"picture{suffix}"
        status, out, err = run_cli("plot", *args, "-o", str(path))
        assert status == 0 and err == "" and str(path) in out
        if suffix == ".png":
            assert_png(path)
        else:
            texts = svg_texts(path)
            if not {"positional", "rope-distance"} & set(args):  # those draw positions, not tokens
                assert set(TOKENS) <= {t.strip() for t in texts}, texts


def test_heatmap_svg_prints_the_seeds_weights(run_cli, tmp_path):
    path = tmp_path / "w.svg"
    assert run_cli("plot", "--kind", "heatmap", "-o", str(path))[0] == 0
    texts = svg_texts(path)
    for weight in CAT_WEIGHTS:
        assert any(t.strip() in (f"{weight:.2f}", f"{weight:.3f}", f"{weight:.4f}") for t in texts), weight


def test_heatmap_colours_span_the_seeds_weights(run_cli, drawn, tmp_path):
    """The colour scale is the seed's smallest to largest weight (softmax of its printed scores), said on the bar."""
    assert run_cli("plot", "--kind", "heatmap", "-o", str(tmp_path / "w.png"))[0] == 0
    weights = [[math.exp(s) / sum(math.exp(t) for t in row) for s in row] for row in ALL_SCORES]
    low, high = min(map(min, weights)), max(map(max, weights))
    image = drawn[0].axes[0].images[0]
    assert image.get_clim() == pytest.approx((low, high), abs=1e-4)  # the seed prints 4 decimals
    assert (round(low, 3), round(high, 3)) == (0.096, 0.204)  # 'cat' to 'the' is the least, 'sat' to itself the most
    label = " ".join(drawn[0].axes[1].get_ylabel().split())
    assert label == "attention weight (colours scaled to this map's 0.096-0.204)"


def test_plot_command_offers_the_fixed_0_to_1_scale(drawn, tmp_path):
    from selfattn.commands.plot import plot
    from selfattn.errors import OptionError

    plot(ExplainConfig(), "heatmap", str(tmp_path / "w.png"), fixed_scale=True)
    assert drawn[0].axes[0].images[0].get_clim() == (0.0, 1.0)
    assert drawn[0].axes[1].get_ylabel() == "attention weight (colours span 0-1)"
    with pytest.raises(OptionError, match="--fixed-scale applies to --kind heatmap"):
        plot(ExplainConfig(), "heads", str(tmp_path / "h.png"), fixed_scale=True)
    assert sorted(os.listdir(tmp_path)) == ["w.png"]


@pytest.mark.parametrize("dim", [16, 64])
def test_rope_picture_turns_feature_pairs_by_m_theta(run_cli, drawn, tmp_path, dim):
    """Each arrow is pair i of a (1, 0, 1, 0, ...) vector at position m: at angle m theta_i, theta_i = 10000^(-2i/d)."""
    assert run_cli("plot", "--kind", "positional", "--positional", "rope", "--dim", str(dim), "-o", str(tmp_path / "r.png"))[0] == 0
    panels = drawn[0].axes
    assert len(panels) == 3 and all(not ax.images for ax in panels)  # arrows, not a table like the sinusoidal one
    pairs = [int(re.match(r"pair (\d+):", ax.get_title()).group(1)) for ax in panels]
    assert pairs == [0, dim // 16, dim // 8]  # pairs 0, P/8, P/4 of the P = d/2 pairs
    for ax, i in zip(panels, pairs):
        theta = 10000 ** (-2 * i / dim)  # the paper's frequency
        arrows = ax.collections[0]  # the quiver
        u, v = np.asarray(arrows.U, dtype=float), np.asarray(arrows.V, dtype=float)
        assert len(u) == 8
        np.testing.assert_allclose(np.hypot(u, v), 1.0, atol=1e-12)  # a turn keeps the length
        turned = np.arctan2(v, u)
        expected = np.array([m * theta for m in range(8)])
        wrapped = np.angle(np.exp(1j * (turned - expected)))  # the difference, modulo 2 pi
        np.testing.assert_allclose(wrapped, 0.0, atol=1e-9)
        assert f"θ_{i} = {theta:.3g} rad per position" in ax.get_title()
        assert (ax.get_xlabel(), ax.get_ylabel()) == (f"feature {2 * i}", f"feature {2 * i + 1}")
    assert "m·θ_i" in drawn[0].get_suptitle()


def test_arrows_write_the_querys_weights(run_cli, tmp_path):
    path = tmp_path / "a.svg"
    assert run_cli("plot", "--kind", "arrows", "-o", str(path))[0] == 0
    numbers = [float(t) for t in svg_texts(path) if re.fullmatch(r"\s*\d\.\d+\s*", t)]
    assert sorted(round(n, 2) for n in numbers) == sorted(round(w, 2) for w in CAT_WEIGHTS)


def test_non_latin_and_markup_tokens_do_not_crash(run_cli, tmp_path):
    sentence = "猫 قطة 😀 $x$ a_b^c <b>bold</b> &amp;"
    for kind in ("heatmap", "arrows", "heads"):
        path = tmp_path / f"{kind}.svg"
        status, _, err = run_cli("plot", sentence, "--kind", kind, "-o", str(path))
        assert status == 0 and err == "", err
        assert {"猫", "$x$", "<b>bold</b>", "&amp;"} <= {t.strip() for t in svg_texts(path)}


@pytest.mark.parametrize(
    "args,message",
    [
        (["--kind", "pie"], "invalid choice"),
        (["--kind", "heatmap", "-o", "{dir}/w.jpg"], "unsupported output extension '.jpg'"),
        (["--kind", "heatmap", "-o", "{dir}/w"], "unsupported output extension no extension"),
        (["--kind", "heatmap", "-o", "{dir}/missing/w.png"], "does not exist"),
        (["--kind", "heatmap", "-o", "{dir}"], "it is a folder"),
        (["--kind", "heatmap", "--head", "1"], "--head 1 is out of range: this input has 1 head"),
        (["--kind", "heatmap", "--variant", "multihead", "--head", "2"], "--head 2 is out of range: this input has 2 heads (0 to 1)"),
        (["--kind", "heatmap", "--head", "-1"], "--head -1 is out of range"),
        (["--kind", "heatmap", "--layer", "1"], "--layer 1 is out of range"),
        (["--kind", "heatmap", "--mask", "causal"], "--mask applies to --kind mask"),
        (["--kind", "mask", "--mask", "diagonal"], "unknown mask 'diagonal'"),
        (["--kind", "mask", "--mask", "padding:99"], "padding:99"),
        (["--kind", "mask", "--mask", "sliding-window:x"], "whole number"),
        (["--kind", "mask", "--mask", "sliding-window:0"], "at least 1 token"),
        (["--kind", "mask", "--mask", "documents:3,5"], "the documents hold 8 tokens, the sentence has 7"),
        (["--kind", "mask", "--mask", "documents:3,x"], "whole numbers >= 1"),
        (["--kind", "mask", "--tile", "0"], "--tile must be a whole number >= 1"),
        (["--kind", "heatmap", "--tile", "2"], "--tile applies to --kind mask"),
        (["--kind", "positional", "--positional", "alibi"], "sinusoidal or rope"),
        (["--kind", "positional", "--positional", "rope", "--dim", "7"], "even"),
        (["--kind", "rope-distance", "--embed", "random", "--dim", "1"], "at least 2"),
        (["--kind", "rope-distance", "--positional", "learned"], "compares rope with sinusoidal"),
        (["--kind", "heatmap", "--variant", "nope"], "unknown variant"),
        (["--kind", "heatmap", "--query", "dog"], "dog"),
    ],
)
def test_bad_plot_input_is_one_line_exit_2_and_leaves_no_file(run_cli, tmp_path, args, message):
    args = [a.replace("{dir}", str(tmp_path)) for a in args]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "out.png")]
    status, out, err = run_cli("plot", *args)
    assert status == 2 and out == "" and err.count("\n") == 1
    assert message in err, err
    assert_only(tmp_path, [])


def test_unwritable_folder_is_refused_before_any_work(run_cli, read_only_folder):
    for command, name in ((["plot", "--kind", "heatmap"], "w.png"), (["view"], "w.html")):
        status, _, err = run_cli(*command, "-o", str(read_only_folder / name))
        assert status == 2 and "no permission" in err, err
    assert_only(read_only_folder, [])


def test_a_failed_write_keeps_the_old_file(run_cli, tmp_path, monkeypatch):
    target = tmp_path / "page.html"
    target.write_text("old")

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("pathlib.Path.write_text", broken)
    status, _, err = run_cli("view", "-o", str(target))
    assert status == 2 and "No space left on device" in err
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert_only(tmp_path, ["page.html"])


def embedded_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', page, re.S)
    assert match, "the page embeds its data"
    return json.loads(match.group(1))


@pytest.mark.parametrize("args", [[], ["--variant", "causal"], ["--variant", "gqa", "--positional", "rope"]])
def test_view_writes_one_self_contained_page_with_explains_numbers(run_cli, tmp_path, args):
    path = tmp_path / "explorer.html"
    status, out, err = run_cli("view", *args, "-o", str(path))
    assert status == 0 and err == ""
    page = path.read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page and "<link" not in page
    assert not re.search(r"<script[^>]*\ssrc=", page)
    data = embedded_data(page)
    status, explained, _ = run_cli("explain", *args, "--format", "json")
    reference = json.loads(explained)
    assert data["tokens"] == reference["tokens"]
    weights = torch.tensor(reference["weights"], dtype=torch.float64)
    if weights.dim() == 2:
        weights = weights[None]
    for h, entry in enumerate(data["layers"][0]["heads"]):
        torch.testing.assert_close(torch.tensor(entry["weights"], dtype=torch.float64), weights[h], atol=5e-5, rtol=0)


def test_view_refusals(run_cli, tmp_path):
    for args, message in (
        (["-o", str(tmp_path / "e.txt")], "unsupported output extension '.txt'"),
        (["-o", str(tmp_path / "e.html"), "--head", "4", "--variant", "gqa"], "--head 4 is out of range"),
        (["-o", str(tmp_path / "e.html"), "--precision", "12"], "--precision"),
        (["-o", str(tmp_path / "e.html"), " ".join(["w"] * 513)], "at most 512"),
    ):
        status, out, err = run_cli("view", *args)
        assert status == 2 and out == "" and message in err, err
    assert_only(tmp_path, [])


def test_traces_render_in_jupyter_as_the_explorer():
    from notebook import shown_in_jupyter

    for trace in (build_trace(ExplainConfig()), build_trace(ExplainConfig(variant="multihead"))):
        frame = shown_in_jupyter(trace)
        assert frame.startswith("<iframe") and 'sandbox="allow-scripts"' in frame
        srcdoc = html.unescape(re.search(r'srcdoc="(.*?)"', frame, re.S).group(1))
        assert embedded_data(srcdoc)["tokens"] == trace.tokens
        assert frame == sa.explore(trace).html()  # the same page as asking for it


def test_importing_selfattn_in_ipython_registers_the_explorer():
    """In a fresh process with an IPython shell running, ``import selfattn`` alone makes a trace show as its page."""
    pytest.importorskip("IPython")
    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "import selfattn as sa\n"
        "data, _ = shell.display_formatter.format(sa.build_trace(sa.ExplainConfig()))\n"
        "print(data['text/html'][:7])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "<iframe"


def test_explore_refuses_what_it_cannot_show():
    with pytest.raises(TypeError, match="explore shows one of AttentionTrace, ModelOutput; not a str"):
        sa.explore("The cat")


def test_view_numbers_match_json_at_the_shown_precision(run_cli, tmp_path):
    path = tmp_path / "e.html"
    assert run_cli("view", "--precision", "3", "-o", str(path))[0] == 0
    steps = embedded_data(path.read_text(encoding="utf-8"))["layers"][0]["heads"][0]["steps"]
    reference = json.loads(render_json(build_trace(ExplainConfig(format="json"))))
    assert steps["exp_sum"][1] == round(reference["query"]["stable"]["exp_sum"], 3)
    assert steps["scores"][1] == [round(s, 3) for s in reference["query"]["scores"]]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["heatmap", "arrows", "heads", "mask", "positional", "rope-distance", "pie"]),
    variant=st.sampled_from(["simple", "causal", "gqa"]),
    head=st.integers(-1, 4),
    mask=st.one_of(st.none(), st.sampled_from(["causal", "padding:3", "sliding-window:2", "causal-bottom-right"]), st.text(max_size=6)),
    suffix=st.sampled_from([".png", ".svg", ".jpg", ""]),
)
def test_any_plot_request_ends_in_a_picture_or_one_error_line(run_cli, tmp_path_factory, kind, variant, head, mask, suffix):
    folder = tmp_path_factory.mktemp("fuzz")
    args = ["plot", "the cat saw the dog", "--embed", "random", "--dim", "4", "--variant", variant]
    args += ["--kind", kind, "--head", str(head), "-o", str(folder / f"out{suffix}")]
    if mask is not None:
        args.append("--mask=" + mask)
    status, out, err = run_cli(*args)
    if status == 0:
        assert err == "" and os.listdir(folder) == [f"out{suffix}"]
    else:
        assert status == 2 and out == "" and err.count("\n") == 1, err
        assert_only(folder, [])


def test_mask_plot_draws_the_block_map_of_packed_documents(run_cli, tmp_path):
    """documents:3,4 with 2x2 tiles: the title's counts equal a block loop over the block-diagonal mask."""
    path = tmp_path / "docs.svg"
    status, _, err = run_cli("plot", "--kind", "mask", "--mask", "documents:3,4", "--tile", "2", "-o", str(path))
    assert status == 0 and err == ""
    doc = [0, 0, 0, 1, 1, 1, 1]
    states = []
    for r in range(0, 7, 2):
        for c in range(0, 7, 2):
            seen = [doc[i] == doc[j] for i in range(r, min(r + 2, 7)) for j in range(c, min(c + 2, 7))]
            states.append("skipped" if not any(seen) else "full" if all(seen) else "partial")
    expected = (f"2x2 tiles: {states.count('skipped')} skipped, {states.count('full')} full, "
                f"{states.count('partial')} partial of 16")
    texts = " ".join(svg_texts(path))
    assert expected in texts and "Packed documents of 3, 4 tokens" in texts


# plot --kind mask --length N: the block map of a mask at a real length.
def dense_reference(spec: str, n: int) -> torch.Tensor:
    """(n, n + cached) bool, True = may attend: each spec's rule written out by a loop, as its docs state it."""
    name, _, argument = spec.partition(":")
    number = int(argument) if argument.isdigit() else None
    cached = number if name == "causal-bottom-right" else 0
    if name == "documents":
        lengths = [int(size) for part in argument.split(",") for size, _, count in [part.partition("x")]
                   for _ in range(int(count or 1))]
        document = [d for d, size in enumerate(lengths) for _ in range(size)]
    rules = {
        "causal": lambda i, j: j <= i,
        "causal-bottom-right": lambda i, j: j <= i + cached,
        "sliding-window": lambda i, j: i - number < j <= i,
        "padding": lambda i, j: j < number,
        "documents": lambda i, j: document[i] == document[j],
        "prefix-lm": lambda i, j: j <= i or j < number,
        "none": lambda i, j: True,
    }
    return torch.tensor([[rules[name](i, j) for j in range(n + cached)] for i in range(n)])


def blocks_of(mask: torch.Tensor, block: int) -> list[list[int]]:
    """EMPTY / FULL / PARTIAL of each block x block tile, by all / any over the dense mask."""
    rows, cols = mask.shape
    return [[EMPTY if not tile.any() else FULL if tile.all() else PARTIAL
             for tile in (mask[r:r + block, c:c + block] for c in range(0, cols, block))]
            for r in range(0, rows, block)]


def drawn_states(figure) -> list[list[int]]:
    return np.asarray(figure.axes[0].images[0].get_array()).astype(int).tolist()


MASK_MODS = '''
import torch

def dilated(b, h, q_idx, kv_idx):  # causal, every other key
    return (q_idx >= kv_idx) & ((q_idx - kv_idx) % 2 == 0)

def local_both_ways(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx).abs() <= 6

def counts(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx).int()

def fails(b, h, q_idx, kv_idx):
    raise KeyError("no such table")

def python_bool(b, h, q_idx, kv_idx):
    return True

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def mask_mods(tmp_path):
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "my_masks.py").write_text(MASK_MODS)
    (folder / "broken.py").write_text("def dilated(b, h, q, kv):\n    return q >=\n")
    (folder / "not_python.txt").write_text("x = 1\n")
    return folder


@pytest.mark.parametrize("length,tile", [(37, 8), (40, 5), (16, 16), (9, 4)])
@pytest.mark.parametrize("spec", ["causal", "causal-bottom-right:5", "sliding-window:6", "padding:30", "documents:10,20,7",
                                  "documents:5x5,12", "prefix-lm:9", "none"])
def test_block_map_cells_equal_the_dense_masks_blocks(run_cli, drawn, tmp_path, spec, length, tile):
    """Each cell's state against all / any over the mask written out densely by a loop, at lengths the tile does not divide."""
    if spec.startswith("documents") and length != 37:
        spec = f"documents:{length - length // 3},{length // 3}"
    if spec.startswith(("padding", "prefix-lm")):
        spec = spec.split(":")[0] + f":{min(int(spec.split(':')[1]), length)}"
    path = tmp_path / "map.png"
    status, out, err = run_cli("plot", "--kind", "mask", "--mask", spec, "--length", str(length), "--tile", str(tile),
                               "-o", str(path))
    assert status == 0 and err == "" and str(path) in out, err
    assert drawn_states(drawn[-1]) == blocks_of(dense_reference(spec, length), tile)
    assert_png(path)


@pytest.mark.parametrize("name,rule", [
    ("dilated", lambda i, j: j <= i and (i - j) % 2 == 0),
    ("local_both_ways", lambda i, j: abs(i - j) <= 6),
])
def test_block_map_of_a_mask_mod_from_a_file(run_cli, drawn, tmp_path, mask_mods, name, rule):
    path = tmp_path / "map.svg"
    status, _, err = run_cli("plot", "--kind", "mask", "--mask-mod", f"{mask_mods / 'my_masks.py'}:{name}",
                             "--length", "45", "--tile", "4", "-o", str(path))
    assert status == 0 and err == "", err
    dense = torch.tensor([[rule(i, j) for j in range(45)] for i in range(45)])
    expected = blocks_of(dense, 4)
    assert drawn_states(drawn[-1]) == expected
    flat = [s for row in expected for s in row]
    computed = round(100 * sum(s != EMPTY for s in flat) / len(flat))
    title = drawn[-1].axes[0].get_title().split("\n")
    assert " ".join(title[:-1]) == f"mask_mod {mask_mods / 'my_masks.py'}:{name} over 45 tokens"
    assert title[-1].startswith(f"12 x 12 blocks of 4: {computed}% computed")
    assert f"partial: mask applied per element ({sum(s == PARTIAL for s in flat)})" in svg_texts(path)


def test_block_map_title_says_how_much_is_computed(run_cli, tmp_path):
    """The issue's example: a 256-token window at 4096 in blocks of 128 computes 3 blocks per row of 32."""
    path = tmp_path / "map.svg"
    assert run_cli("plot", "--kind", "mask", "--mask", "sliding-window:256", "--length", "4096", "-o", str(path))[0] == 0
    texts = " ".join(svg_texts(path))
    # Row block i sees key blocks i - 2 (partial), i - 1 (full) and i (partial): 32 + 31 + 30 of 1024 blocks.
    assert "32 x 32 blocks of 128: 9% computed, 6% partial" in texts
    assert "full: computed without a mask (31)" in texts and "empty: skipped (931)" in texts


def test_block_map_at_65536_is_quick_and_makes_no_n_by_n_tensor(run_cli, drawn, tmp_path):
    from test_flash_memory import LargestTensors

    n, path = 65536, tmp_path / "map.png"
    started = time.perf_counter()
    with LargestTensors() as recorder:
        status, _, err = run_cli("plot", "--kind", "mask", "--mask", "documents:8192x7,4096,4096", "--length", str(n),
                                 "-o", str(path))
    assert status == 0 and err == "", err
    assert time.perf_counter() - started < 30
    assert max(numel for _, numel in recorder.produced) <= 512 * 512  # the map itself, 512 x 512 blocks of 128
    states = drawn_states(drawn[-1])
    assert len(states) == len(states[0]) == 512
    document = torch.arange(n) // 8192
    document[7 * 8192 + 4096:] = 8  # the last 8192 are two documents of 4096
    for row in (0, 63, 64, 511):  # a few row blocks against the dense rows of that block
        rows = document[row * 128:(row + 1) * 128, None] == document[None, :]  # (128, n)
        assert states[row] == blocks_of(rows, 128)[0]


def test_prefix_lm_over_the_sentence(run_cli, drawn, tmp_path):
    assert run_cli("plot", "--kind", "mask", "--mask", "prefix-lm:3", "-o", str(tmp_path / "p.png"))[0] == 0
    np.testing.assert_array_equal(np.asarray(drawn[-1].axes[0].images[0].get_array()), dense_reference("prefix-lm:3", 7).int())


@pytest.mark.parametrize(
    "args,message",
    [
        (["--length", "64"], "give --mask SPEC or --mask-mod FILE.py:NAME"),
        (["--length", "0", "--mask", "causal"], "--length must be a whole number from 1 to 1048576, got 0"),
        (["--length", "2000000", "--mask", "causal"], "--length must be a whole number from 1"),
        (["--length", "64", "--mask", "causal", "--tile", "0"], "--tile must be a whole number >= 1, got 0"),
        (["--length", "64", "--mask", "diagonal"], "unknown mask 'diagonal'"),
        (["--length", "64", "--mask", "sliding-window:0"], "at least 1 token"),
        (["--length", "64", "--mask", "padding:65"], "padding:65 needs a length from 0 to --length 64"),
        (["--length", "64", "--mask", "prefix-lm:65"], "prefix-lm:65 needs a prefix from 0 to --length 64"),
        (["--length", "64", "--mask", "prefix-lm:x"], "whole number"),
        (["--length", "64", "--mask", "documents:30,30"], "the documents hold 60 tokens, --length is 64"),
        (["--length", "64", "--mask", "documents:8x"], "whole numbers >= 1"),
        (["--length", "65536", "--mask", "causal", "--tile", "8"], "8192 blocks per axis"),
        (["--length", "64", "--mask", "causal", "--kind", "heatmap"], "--length applies to --kind mask"),
        (["--length", "64", "--mask", "causal", "--block-size", "8"], "give the block map's block size with --tile"),
        (["--length", "64", "--mask", "causal", "--variant", "causal"], "it does not take --variant"),
        (["--length", "64", "--mask", "causal", "the", "cat"], "it does not take a sentence"),
        (["--length", "64", "--mask", "causal", "--mask-mod", "{mods}/my_masks.py:dilated"], "not both"),
        (["--mask-mod", "{mods}/my_masks.py:dilated"], "give its length with --length N"),
        (["--length", "70000", "--mask-mod", "{mods}/my_masks.py:dilated"], "at most 65536"),
        (["--length", "64", "--mask-mod", "{mods}/my_masks.py"], "as FILE.py:NAME"),
        (["--length", "64", "--mask-mod", "{mods}/missing.py:dilated"], "there is no file"),
        (["--length", "64", "--mask-mod", "{mods}/not_python.txt:x"], "is not a Python file"),
        (["--length", "64", "--mask-mod", "{mods}/broken.py:dilated"], "importing"),
        (["--length", "64", "--mask-mod", "{mods}/my_masks.py:nowhere"], "has no nowhere"),
        (["--length", "64", "--mask-mod", "{mods}/my_masks.py:NOT_A_FUNCTION"], "not a function"),
        (["--length", "64", "--mask-mod", "{mods}/my_masks.py:counts"], "must return a torch.bool tensor, got torch.int32"),
        (["--length", "64", "--mask-mod", "{mods}/my_masks.py:python_bool"], "must return a tensor"),
        (["--length", "64", "--mask-mod", "{mods}/my_masks.py:fails"], "the mask_mod failed: KeyError"),
        (["--kind", "training", "--training", "{mods}", "--length", "64"], "--length"),
    ],
)
def test_bad_block_map_input_is_one_line_exit_2(run_cli, tmp_path, mask_mods, args, message):
    args = [a.replace("{mods}", str(mask_mods)) for a in args]
    kind = [] if "--kind" in args else ["--kind", "mask"]
    status, out, err = run_cli("plot", *kind, *args, "-o", str(tmp_path / "map.png"))
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert message in err, err
    assert_only(tmp_path, ["mods"])
