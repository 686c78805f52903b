"""The matplotlib pictures: what each figure shows, and how save_figure writes files.

Each figure is checked against the data it was given (image arrays, tick texts, cell
texts, arrow widths), and each file against its format's own definition: the PNG
signature and IHDR chunk, and the SVG's XML parsed with ElementTree. The figures are
built without pyplot, so no global figure list holds them: nothing needs closing.
"""

import math
import os
import struct
import time
import warnings
import xml.etree.ElementTree as ET

import numpy as np
import matplotlib
import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from selfattn.errors import OptionError, OutputError, QueryError, ShapeError
from selfattn.render.visual import plots, positional_plots

TOKENS = ["The", "cat", "sat"]
SEED_TOKENS = ["The", "cat", "sat", "on", "the", "warm", "mat"]
SEED_X = [[0.41, 0.12, 0.73], [0.58, 0.91, 0.44], [0.33, 0.76, 0.89], [0.15, 0.42, 0.67],
          [0.39, 0.14, 0.71], [0.82, 0.53, 0.29], [0.61, 0.85, 0.47]]  # the seed's hand-made table
# rows sum to 1, as attention weights do; written out so the expected cell texts are known
WEIGHTS = [[0.5, 0.3, 0.2], [0.192, 0.708, 0.1], [0.0, 0.25, 0.75]]
CELL_TEXTS = ["0.50", "0.30", "0.20", "0.19", "0.71", "0.10", "0.00", "0.25", "0.75"]
TRICKY = ["猫", "قطة", "😀", "Ωmega", "$x$", "a_b^c", "<b>", "&amp;"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def tick_texts(axis) -> list[str]:
    return [label.get_text() for label in axis.get_ticklabels()]


def cell_texts(ax) -> list[str]:
    return [text.get_text() for text in ax.texts]


def svg_texts(path) -> list[str]:
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return ["".join(element.itertext()) for element in root.iter("{http://www.w3.org/2000/svg}text")]


def assert_image_equals(ax, expected, tolerance=1e-12):
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), np.asarray(expected, dtype=float),
                               rtol=0, atol=tolerance)


def assert_no_leftovers(folder, expected_names):
    assert sorted(os.listdir(folder)) == sorted(expected_names)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"  # the first chunk, as the PNG specification requires
    return struct.unpack(">II", data[16:24])


def test_heatmap_shows_weights_labels_and_cell_values():
    fig = plots.heatmap_figure(torch.tensor(WEIGHTS), TOKENS, title="weights")
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 2  # the heatmap and its colorbar
    ax = fig.axes[0]
    assert tick_texts(ax.xaxis) == TOKENS
    assert tick_texts(ax.yaxis) == TOKENS
    assert ax.get_xlabel() == "key" and ax.get_ylabel() == "query" and ax.get_title() == "weights"
    assert_image_equals(ax, WEIGHTS, tolerance=1e-7)  # float32 tensor in
    assert cell_texts(ax) == CELL_TEXTS  # row by row
    assert all(label.get_rotation() == 90 for label in ax.get_xticklabels())


def colour_bar_axes(fig):
    return [ax for ax in fig.axes if not ax.images][-1]  # the colour bar holds no image of its own


def test_heatmap_colours_span_the_data_and_the_label_says_so():
    """Near-uniform weights (an untrained head) get the whole colour map, not one colour of 0-1."""
    weights = np.array([[0.137, 0.149, 0.142, 0.143, 0.143, 0.143, 0.143]] * 7)
    assert np.allclose(weights.sum(-1), 1.0)
    fig = plots.heatmap_figure(weights, [f"t{i}" for i in range(7)])
    image = fig.axes[0].images[0]
    assert image.norm.vmin == pytest.approx(0.137, abs=1e-12) and image.norm.vmax == pytest.approx(0.149, abs=1e-12)
    label = colour_bar_axes(fig).get_ylabel()
    assert " ".join(label.split()) == "attention weight (colours scaled to this map's 0.137-0.149)"
    # 0.137 and 0.149 are the two ends of the colour map: as far apart as colours get.
    assert image.norm(0.137) == pytest.approx(0.0) and image.norm(0.149) == pytest.approx(1.0)


def test_heatmap_fixed_scale_spans_0_to_1():
    weights = np.full((3, 3), 1 / 3)
    weights[0] = [0.2, 0.3, 0.5]
    fig = plots.heatmap_figure(weights, TOKENS, fixed_scale=True)
    assert fig.axes[0].images[0].get_clim() == (0.0, 1.0)
    assert colour_bar_axes(fig).get_ylabel() == "attention weight (colours span 0-1)"
    uniform = plots.heatmap_figure(np.ones((2, 2)) / 2, ["a", "b"])  # one value: no span to scale to
    assert uniform.axes[0].images[0].get_clim() == (0.0, 1.0)
    assert colour_bar_axes(uniform).get_ylabel() == "attention weight (all 0.500; colours span 0-1)"


def test_heatmap_scale_leaves_out_hidden_cells():
    weights = [[0.9, 0.05, 0.05], [0.4, 0.6, 0.0], [0.3, 0.3, 0.4]]
    hidden = ~torch.ones(3, 3, dtype=torch.bool).tril()  # above the diagonal: 0.05, 0.05 and 0.0, all hidden
    fig = plots.heatmap_figure(weights, TOKENS, hidden=hidden)
    assert fig.axes[0].images[0].get_clim() == pytest.approx((0.3, 0.9))  # the smallest and largest seen
    assert " ".join(colour_bar_axes(fig).get_ylabel().split()).endswith("0.300-0.900)")


def label_clear_of_ticks(fig, dpi) -> float:
    """Points between a colour bar's tick labels and its label, drawn on the Agg canvas at ``dpi``; asserts no overlap."""
    fig.set_dpi(dpi)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    bar = colour_bar_axes(fig)
    label = bar.yaxis.label.get_window_extent(renderer)
    ticks = [t.get_window_extent(renderer) for t in bar.get_yticklabels() if t.get_text()]
    assert ticks and label.width > 0
    for tick in ticks:
        assert not label.overlaps(tick), (label, tick)
    return (label.x0 - max(tick.x1 for tick in ticks)) * 72 / dpi


SEED_WEIGHTS = torch.softmax(torch.tensor(SEED_X) @ torch.tensor(SEED_X).T, dim=-1)  # the seed's 7 x 7, by torch


@pytest.mark.parametrize("dpi", [100, plots.PNG_DPI])
@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: plots.heads_figure(SEED_WEIGHTS[None], SEED_TOKENS, head_names=["head 0"],
                                                title="Attention weights of every head (simple)"), id="heads-toy"),
        pytest.param(lambda: plots.heads_figure(torch.softmax(torch.randn(4, 7, 7, generator=torch.Generator().manual_seed(3)), -1),
                                                SEED_TOKENS), id="heads-4"),
        pytest.param(lambda: plots.heatmap_figure(SEED_WEIGHTS, SEED_TOKENS), id="heatmap"),
    ],
)
def test_colour_bar_label_stays_clear_of_its_tick_labels(build, dpi):
    """The label's box on the canvas overlaps no tick label, with room to spare for an SVG viewer's wider font."""
    gap = label_clear_of_ticks(build(), dpi)
    assert gap >= 8, f"only {gap:.1f} pt between the ticks and the label"


def test_heatmap_cell_text_contrasts_with_its_colour():
    fig = plots.heatmap_figure([[0.0, 1.0]], ["q"], ["dark", "light"])
    colours = [text.get_color() for text in fig.axes[0].texts]
    assert colours == ["white", "black"]  # viridis runs from dark purple to light yellow


def test_heatmap_separate_key_labels_and_forced_values():
    weights = [[0.25, 0.75, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4]]
    fig = plots.heatmap_figure(weights, ["a", "b"], ["w", "x", "y", "z"], values=False, xlabel="k", ylabel="q")
    ax = fig.axes[0]
    assert tick_texts(ax.xaxis) == ["w", "x", "y", "z"] and tick_texts(ax.yaxis) == ["a", "b"]
    assert_image_equals(ax, weights)
    assert cell_texts(ax) == []
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("k", "q")


def test_heatmap_of_25_tokens_has_no_cell_values():
    tokens = [f"t{i}" for i in range(25)]
    weights = torch.softmax(torch.randn(25, 25, generator=torch.Generator().manual_seed(0)), dim=-1)
    ax = plots.heatmap_figure(weights, tokens).axes[0]
    assert cell_texts(ax) == []
    assert tick_texts(ax.xaxis) == tokens
    assert_image_equals(ax, weights.double(), tolerance=1e-7)


def test_heatmap_of_256_tokens_thins_labels_and_renders(tmp_path):
    tokens = [f"t{i}" for i in range(256)]
    weights = torch.softmax(torch.randn(256, 256, generator=torch.Generator().manual_seed(1)), dim=-1)
    start = time.perf_counter()
    fig = plots.heatmap_figure(weights, tokens)
    path = plots.save_figure(fig, tmp_path / "big.png")
    elapsed = time.perf_counter() - start
    shown = tick_texts(fig.axes[0].xaxis)
    assert 0 < len(shown) <= plots.MAX_TICK_LABELS
    assert shown == tokens[:: math.ceil(256 / plots.MAX_TICK_LABELS)]  # every k-th, from the first
    assert cell_texts(fig.axes[0]) == []
    width, height = fig.get_size_inches()
    assert width <= 16 and height <= 16
    assert png_size(path) == (round(width * plots.PNG_DPI), round(height * plots.PNG_DPI))
    assert elapsed < 10, f"256-token heatmap took {elapsed:.1f} s"


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: plots.heatmap_figure(WEIGHTS, ["a", "b"]), ShapeError),
        (lambda: plots.heatmap_figure([0.5, 0.5], ["a", "b"]), ShapeError),
        (lambda: plots.heatmap_figure([[0.5, 0.5], [1.0]], ["a", "b"]), ShapeError),
        (lambda: plots.heatmap_figure(WEIGHTS, "cat"), ShapeError),
        (lambda: plots.heatmap_figure([[1.5, -0.5], [0.5, 0.5]], ["a", "b"]), OptionError),
        (lambda: plots.arrows_figure(TOKENS, [0.5, 0.5], 0), ShapeError),
        (lambda: plots.arrows_figure(TOKENS, WEIGHTS[0], "dog"), QueryError),
        (lambda: plots.arrows_figure(TOKENS, WEIGHTS[0], 3), QueryError),
        (lambda: plots.heads_figure(torch.ones(2, 3, 4) / 4, TOKENS), ShapeError),
        (lambda: plots.heads_figure(torch.ones(2, 3, 3) / 3, TOKENS, head_names=["only one"]), ShapeError),
        (lambda: plots.mask_figure([[1, 0], [1, 1]]), OptionError),
        (lambda: positional_plots.positional_figure(torch.zeros(4)), ShapeError),
        (lambda: positional_plots.rope_turns_figure(torch.zeros(8, 2, 3), [0, 1], [1.0, 0.1]), ShapeError),
        (lambda: positional_plots.rope_turns_figure(torch.zeros(8, 2, 2), [0], [1.0, 0.1]), ShapeError),
    ],
)
def test_bad_inputs_raise_typed_errors(call, error):
    with pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, ValueError)
    assert "\n" not in str(raised.value)


def arrows_of(fig) -> list[FancyArrowPatch]:
    return [patch for patch in fig.axes[0].patches if isinstance(patch, FancyArrowPatch)]


def test_arrows_width_and_opacity_follow_the_weights():
    tokens = ["The", "cat", "sat", "on", "the", "warm", "mat"]
    weights = [0.05, 0.192, 0.3, 0.02, 0.04, 0.25, 0.148]
    fig = plots.arrows_figure(tokens, torch.tensor(weights, dtype=torch.float64), 1, title="cat")
    arrows = arrows_of(fig)
    assert len(arrows) == len(tokens)
    widths = [arrow.get_linewidth() for arrow in arrows]
    alphas = [arrow.get_alpha() for arrow in arrows]
    top = max(weights)
    np.testing.assert_allclose(widths, [0.5 + 8 * w / top for w in weights], rtol=1e-12)
    np.testing.assert_allclose(alphas, [0.15 + 0.85 * w / top for w in weights], rtol=1e-12)
    order = np.argsort(weights)
    assert list(np.argsort(widths)) == list(order)  # a heavier weight never gets a thinner arrow
    assert int(np.argmax(widths)) == weights.index(top)
    texts = cell_texts(fig.axes[0])
    assert [f"{w:.3f}" for w in weights] == [t for t in texts if t[:2] == "0."]
    assert fig.axes[0].get_title() == "cat"


def test_arrows_list_every_token_in_order_and_mark_the_query():
    tokens = ["the", "cat", "saw", "the", "dog"]
    fig = plots.arrows_figure(tokens, [0.1, 0.2, 0.3, 0.25, 0.15], 3)
    ax = fig.axes[0]
    query_text, *rest = ax.texts  # the query on the left comes first
    assert query_text.get_text() == "the" and query_text.get_fontweight() == "bold"
    listed = [text for text in rest if text.get_text() in tokens]
    listed.sort(key=lambda text: text.get_position()[1])  # y grows downwards: top row first
    assert [text.get_text() for text in listed] == tokens
    assert [text.get_fontweight() for text in listed] == ["normal", "normal", "normal", "bold", "normal"]
    assert len(arrows_of(fig)) == 5


def test_arrows_accept_a_query_token_and_all_zero_weights():
    fig = plots.arrows_figure(["a", "b"], [0.0, 0.0], "b")
    arrows = arrows_of(fig)
    assert [arrow.get_linewidth() for arrow in arrows] == [0.5, 0.5]
    assert fig.axes[0].texts[0].get_text() == "b"


def test_heads_grid_labels_only_outer_axes():
    tokens = ["a", "b", "c"]
    weights = torch.softmax(torch.randn(2, 3, 3, 3, generator=torch.Generator().manual_seed(2)), dim=-1)
    fig = plots.heads_figure(weights, tokens, title="all heads")
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 6 and len(fig.axes) == 7  # 2 layers x 3 heads, and one colorbar
    grid = np.array(panels, dtype=object).reshape(2, 3)
    for (layer, head), ax in np.ndenumerate(grid):
        assert_image_equals(ax, weights[layer, head].double(), tolerance=1e-7)
        assert ax.get_title() == (f"head {head}" if layer == 0 else "")
        assert tick_texts(ax.xaxis) == (tokens if layer == 1 else [])
        assert tick_texts(ax.yaxis) == (tokens if head == 0 else [])
        assert ax.get_ylabel() == (f"layer {layer}" if head == 0 else "")
        assert cell_texts(ax) == []
    assert fig.get_suptitle() == "all heads"


def test_heads_accept_one_layer_and_custom_names():
    weights = [[[0.5, 0.5], [0.25, 0.75]], [[1.0, 0.0], [0.0, 1.0]]]
    fig = plots.heads_figure(weights, ["x", "y"], head_names=["h0", "h1"])
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == ["h0", "h1"]
    assert [ax.get_ylabel() for ax in panels] == ["", ""]  # a single layer needs no row label
    for ax, expected in zip(panels, weights):
        assert_image_equals(ax, expected)
    named = plots.heads_figure(weights, ["x", "y"], layer_names=["final"])
    assert named.axes[0].get_ylabel() == "final"


def test_mask_figure_shows_allowed_as_one_and_a_legend():
    mask = torch.ones(3, 4, dtype=torch.bool).tril(diagonal=1)
    fig = plots.mask_figure(mask, TOKENS, ["k0", "k1", "k2", "k3"], title="causal")
    ax = fig.axes[0]
    assert len(fig.axes) == 1
    assert_image_equals(ax, mask.int())
    assert tick_texts(ax.xaxis) == ["k0", "k1", "k2", "k3"] and tick_texts(ax.yaxis) == TOKENS
    assert [text.get_text() for text in fig.legends[0].get_texts()] == ["may attend", "masked"]
    assert ax.get_title() == "causal"


def test_mask_figure_defaults_to_positions():
    fig = plots.mask_figure([[True, False], [True, True]], allowed_label="$seen$", hidden_label="hidden")
    ax = fig.axes[0]
    assert tick_texts(ax.xaxis) == ["0", "1"] and tick_texts(ax.yaxis) == ["0", "1"]
    assert [text.get_text() for text in fig.legends[0].get_texts()] == ["$seen$", "hidden"]
    assert_image_equals(ax, [[1, 0], [1, 1]])


def test_mask_figure_block_map_outlines_each_tile_by_its_state():
    """Skipped / full / partial tiles against a block-by-block loop over the mask, and the counts in the title."""
    from matplotlib.patches import Rectangle

    mask = torch.tensor([[abs(i - j) <= 1 for j in range(7)] for i in range(7)])  # a band: all three states occur
    fig = plots.mask_figure(mask, block_size=3, title="band")
    ax = fig.axes[0]
    expected = []
    for r in range(0, 7, 3):
        for c in range(0, 7, 3):
            block = mask[r:r + 3, c:c + 3]
            expected.append(("empty" if not block.any() else "full" if block.all() else "partial", c, r))
    tiles = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(tiles) == len(expected) == 9
    colours = {"empty": plots._BLOCK_STYLES[0][0], "full": plots._BLOCK_STYLES[1][0], "partial": plots._BLOCK_STYLES[2][0]}
    for tile, (state, c, r) in zip(tiles, expected):
        assert tile.get_xy() == (c - 0.5, r - 0.5)
        assert matplotlib.colors.to_hex(tile.get_edgecolor()) == colours[state]
        assert (tile.get_hatch() is not None) == (state == "empty")
    counts = {s: sum(e[0] == s for e in expected) for s in ("empty", "full", "partial")}
    assert ax.get_title() == (f"band\n3x3 tiles: {counts['empty']} skipped, {counts['full']} full, "
                              f"{counts['partial']} partial of 9")
    assert counts == {"empty": 2, "full": 1, "partial": 6}  # the corner tile (6, 6) is one visible pair
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert labels[:2] == ["may attend", "masked"] and any("skipped" in label for label in labels)
    with pytest.raises(OptionError, match="tile size"):
        plots.mask_figure(mask, block_size=0)


def test_positional_figure_uses_a_diverging_scale_centred_on_zero():
    positions = torch.arange(6, dtype=torch.float64)[:, None]
    matrix = torch.cat([torch.sin(positions / 3), torch.cos(positions / 3)], dim=1)  # (6, 2)
    fig = positional_plots.positional_figure(matrix, title="sinusoidal")
    ax = fig.axes[0]
    assert len(fig.axes) == 2
    assert_image_equals(ax, matrix)
    assert ax.images[0].get_clim() == (-1.0, 1.0)
    assert ax.images[0].get_cmap().name == "RdBu_r"
    assert tick_texts(ax.yaxis) == [str(i) for i in range(6)] and tick_texts(ax.xaxis) == ["0", "1"]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("dimension", "position", "sinusoidal")
    wide = positional_plots.positional_figure([[3.0, -1.0]]).axes[0].images[0].get_clim()
    assert wide == (-3.0, 3.0)


def test_png_size_matches_figure_size(tmp_path):
    fig = plots.heatmap_figure(WEIGHTS, TOKENS)
    path = plots.save_figure(fig, tmp_path / "weights.PNG")
    assert path == tmp_path / "weights.PNG"
    width, height = fig.get_size_inches()
    assert png_size(path) == (round(width * plots.PNG_DPI), round(height * plots.PNG_DPI))
    assert_no_leftovers(tmp_path, ["weights.PNG"])


def test_svg_keeps_labels_and_title_as_text(tmp_path):
    fig = plots.heatmap_figure(WEIGHTS, TOKENS, title="Attention of the seed")
    texts = svg_texts(plots.save_figure(fig, tmp_path / "weights.svg"))
    assert set(TOKENS + ["Attention of the seed", "key", "query"] + CELL_TEXTS) <= set(texts)


BUILDERS = {
    "heatmap": lambda tokens: plots.heatmap_figure(np.eye(len(tokens)), tokens, title=tokens[4]),
    "arrows": lambda tokens: plots.arrows_figure(tokens, np.full(len(tokens), 1 / len(tokens)), 0),
    "heads": lambda tokens: plots.heads_figure(np.eye(len(tokens))[None], tokens),
    "mask": lambda tokens: plots.mask_figure(np.eye(len(tokens), dtype=bool), tokens, tokens),
}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_non_latin_and_markup_labels_render_literally(kind, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a glyph warning or a mathtext error fails the test
        fig = BUILDERS[kind](TRICKY)
        png = plots.save_figure(fig, tmp_path / "tricky.png")
        svg = plots.save_figure(fig, tmp_path / "tricky.svg")
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    texts = svg_texts(svg)
    missing = [token for token in TRICKY if token not in texts]
    assert missing == []


@pytest.mark.parametrize("name", ["out.jpg", "out", "out.png.txt"])
def test_unsupported_extension_is_refused(tmp_path, name):
    fig = plots.heatmap_figure(WEIGHTS, TOKENS)
    with pytest.raises(OutputError, match="unsupported output extension") as raised:
        plots.save_figure(fig, tmp_path / name)
    assert ".png or .svg" in str(raised.value)
    assert_no_leftovers(tmp_path, [])
    assert plots.SUPPORTED_EXTENSIONS == (".png", ".svg")


def test_missing_folder_and_folder_as_target_are_refused(tmp_path):
    fig = plots.heatmap_figure(WEIGHTS, TOKENS)
    missing = tmp_path / "nowhere" / "out.png"
    with pytest.raises(OutputError, match="does not exist") as raised:
        plots.save_figure(fig, missing)
    assert str(missing) in str(raised.value)
    folder = tmp_path / "pictures.svg"
    folder.mkdir()
    with pytest.raises(OutputError, match="folder") as raised:
        plots.check_picture_path(folder)
    assert str(folder) in str(raised.value)
    assert_no_leftovers(tmp_path, ["pictures.svg"])
    assert_no_leftovers(folder, [])


def test_read_only_folder_is_refused(read_only_folder):
    with pytest.raises(OutputError, match="permission") as raised:
        plots.save_figure(plots.heatmap_figure(WEIGHTS, TOKENS), read_only_folder / "out.png")
    assert str(read_only_folder / "out.png") in str(raised.value)
    assert_no_leftovers(read_only_folder, [])


def fail_halfway(self, target, **kwargs):
    with open(target, "wb") as handle:
        handle.write(PNG_SIGNATURE + b"half a picture")
    raise RuntimeError("renderer crashed")


def test_failed_render_leaves_no_file(tmp_path, monkeypatch):
    fig = plots.heatmap_figure(WEIGHTS, TOKENS)
    monkeypatch.setattr(Figure, "savefig", fail_halfway)
    with pytest.raises(RuntimeError, match="renderer crashed"):
        plots.save_figure(fig, tmp_path / "out.png")
    assert not (tmp_path / "out.png").exists()
    assert_no_leftovers(tmp_path, [])


def test_failed_render_keeps_the_old_file(tmp_path, monkeypatch):
    fig = plots.heatmap_figure(WEIGHTS, TOKENS)
    target = plots.save_figure(fig, tmp_path / "out.svg")
    before = target.read_bytes()
    monkeypatch.setattr(Figure, "savefig", fail_halfway)
    with pytest.raises(RuntimeError, match="renderer crashed"):
        plots.save_figure(fig, target)
    assert target.read_bytes() == before
    assert_no_leftovers(tmp_path, ["out.svg"])


def test_check_picture_path_returns_the_path_before_any_work(tmp_path):
    assert plots.check_picture_path(tmp_path / "a.SVG") == tmp_path / "a.SVG"
    assert plots.check_picture_path(str(tmp_path / "b.png")) == tmp_path / "b.png"
    assert_no_leftovers(tmp_path, [])  # checking writes nothing


def test_positional_figure_limit_sets_the_scale_for_small_learned_values():
    table = torch.tensor([[0.05, -0.02], [0.1, 0.0]])  # learned embeddings are small
    ax = positional_plots.positional_figure(table, limit=0.1).axes[0]
    assert ax.images[0].get_clim() == pytest.approx((-0.1, 0.1))
    assert_image_equals(ax, table.double(), tolerance=1e-7)
    for bad in (0, -1.0, float("nan"), "1", True):
        with pytest.raises(OptionError, match="limit"):
            positional_plots.positional_figure(table, limit=bad)


def test_score_grids_figure_draws_each_grid_on_its_own_scale_centred_on_zero():
    first = torch.tensor([[1.0, -2.0], [0.5, 1.0]])
    second = torch.tensor([[10.0, 3.0], [-4.0, 0.0]])
    fig = positional_plots.score_grids_figure([first, second], ["RoPE", "sinusoidal"], title="one pair")
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 2 and len(fig.axes) == 4  # two grids, two colorbars
    for ax, grid, name, limit in zip(panels, (first, second), ("RoPE", "sinusoidal"), (2.0, 10.0)):
        assert_image_equals(ax, grid)
        assert ax.images[0].get_clim() == (-limit, limit)
        assert ax.images[0].get_cmap().name == "RdBu_r"
        assert ax.get_title() == name and (ax.get_xlabel(), ax.get_ylabel()) == ("key position j", "query position i")
        assert tick_texts(ax.xaxis) == tick_texts(ax.yaxis) == ["0", "1"]
    assert fig._suptitle.get_text() == "one pair"
    blank = positional_plots.score_grids_figure([torch.zeros(2, 2)], ["zeros"]).axes[0].images[0].get_clim()
    assert blank == (-1.0, 1.0)


@pytest.mark.parametrize(
    "grids, titles",
    [
        ([], []),
        ([torch.zeros(2, 2)], ["a", "b"]),
        ([torch.zeros(2, 2)], "a"),
        ([torch.zeros(2, 3)], ["a"]),
        ([torch.zeros(2, 2), torch.zeros(3, 3)], ["a", "b"]),
        ([torch.zeros(4)], ["a"]),
    ],
)
def test_score_grids_figure_refuses_grids_that_do_not_fit(grids, titles):
    with pytest.raises(ShapeError):
        positional_plots.score_grids_figure(grids, titles)


def test_block_map_figure_colours_each_block_by_its_state_with_counts():
    """A BlockMask's map drawn cell for cell, against all / any over the dense mask by a loop."""
    from selfattn import create_block_mask
    from selfattn.masks import EMPTY, FULL, PARTIAL
    from selfattn.render.visual.block_map_figure import BLOCK_COLOURS, plot_block_mask

    window = create_block_mask(lambda b, h, q, kv: (q >= kv) & (q - kv < 5), None, None, 23, 23, BLOCK_SIZE=4)
    dense = [[0 <= i - j < 5 for j in range(23)] for i in range(23)]
    expected = []
    for r in range(0, 23, 4):
        cells = [[dense[i][j] for i in range(r, min(r + 4, 23)) for j in range(c, min(c + 4, 23))] for c in range(0, 23, 4)]
        expected.append([EMPTY if not any(cell) else FULL if all(cell) else PARTIAL for cell in cells])
    fig = plot_block_mask(window, title="window of 5")
    ax = fig.axes[0]
    assert_image_equals(ax, expected)
    assert ax.get_xlim() == (0, 23) and ax.get_ylim() == (23, 0)  # the last, shorter blocks to scale
    flat = [s for row in expected for s in row]
    counts = {state: flat.count(state) for state in (EMPTY, FULL, PARTIAL)}
    computed, partial = round(100 * (36 - counts[EMPTY]) / 36), round(100 * counts[PARTIAL] / 36)
    assert ax.get_title() == f"window of 5\n6 x 6 blocks of 4: {computed}% computed, {partial}% partial"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        f"empty: skipped ({counts[EMPTY]})", f"full: computed without a mask ({counts[FULL]})",
        f"partial: mask applied per element ({counts[PARTIAL]})"]
    image = ax.images[0]
    for state, colour in BLOCK_COLOURS.items():
        assert matplotlib.colors.to_hex(image.cmap(image.norm(state))) == colour


def test_plot_block_mask_takes_structured_masks_and_writes_the_file(tmp_path):
    from selfattn.masks import EMPTY, FULL, PARTIAL, CausalMask, DocumentMask, PaddingMask
    from selfattn.render.visual.block_map_figure import plot_block_mask

    fig = plot_block_mask(DocumentMask([3, 5]) & CausalMask(8), block_size=(2, 4))
    document = [0, 0, 0, 1, 1, 1, 1, 1]
    dense = torch.tensor([[document[i] == document[j] and j <= i for j in range(8)] for i in range(8)])
    tiles = [[dense[r:r + 2, c:c + 4] for c in (0, 4)] for r in (0, 2, 4, 6)]
    expected = [[EMPTY if not t.any() else FULL if t.all() else PARTIAL for t in row] for row in tiles]
    assert_image_equals(fig.axes[0], expected)
    assert expected == [[PARTIAL, EMPTY], [PARTIAL, EMPTY], [PARTIAL, PARTIAL], [PARTIAL, PARTIAL]]  # rows 2-3 and 4-5 mix documents
    assert fig.axes[0].get_title() == "4 x 2 blocks of 2 x 4: 75% computed, 75% partial"
    with pytest.raises(OptionError, match="q_len must be a positive integer"):
        plot_block_mask(PaddingMask([5], 8), block_size=4)
    path = tmp_path / "padding.svg"
    plot_block_mask(PaddingMask([5], 8), path, block_size=4, q_len=6, title="$five$ real keys")
    assert "$five$ real keys" in svg_texts(path) and "2 x 2 blocks of 4: 100% computed, 50% partial" in svg_texts(path)
    with pytest.raises(OutputError):
        plot_block_mask(CausalMask(8), tmp_path / "map.jpg")
    assert_no_leftovers(tmp_path, ["padding.svg"])


def test_block_map_summary_says_0_or_100_percent_only_when_exact():
    from selfattn.masks import EMPTY, FULL, PARTIAL
    from selfattn.render.visual.block_map_figure import block_map_summary

    one = np.full((40, 25), EMPTY)
    one[3, 4] = PARTIAL
    assert block_map_summary(one, 128) == "40 x 25 blocks of 128: 0.1% computed, 0.1% partial"
    almost = np.full((40, 25), FULL)
    almost[0, 0] = EMPTY
    assert block_map_summary(almost, (64, 128)) == "40 x 25 blocks of 64 x 128: 99% computed, 0% partial"
    assert block_map_summary(np.full((2, 2), FULL), 1) == "2 x 2 blocks of 1: 100% computed, 0% partial"


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda f: f([[0, 3]], 2, 2, 4), ShapeError, "only EMPTY"),
        (lambda f: f([[0, 1]], 2, 4, 4), ShapeError, "do not tile 4 x 4"),
        (lambda f: f([0, 1], 2, 2, 4), ShapeError, "n_row_blocks"),
        (lambda f: f([[0, 1]], 0, 2, 4), OptionError, "block size"),
        (lambda f: f([[0, 1]], (2, 2, 2), 2, 4), OptionError, "block size"),
        (lambda f: f([[0, 1]], 2, 0, 4), OptionError, "q_len must be a positive integer"),
    ],
)
def test_block_map_figure_refuses_bad_input(call, error, message):
    from selfattn.render.visual.block_map_figure import block_map_figure

    with pytest.raises(error, match=message):
        call(block_map_figure)


def test_plot_block_mask_refuses_what_is_not_a_mask():
    from selfattn.render.visual.block_map_figure import plot_block_mask

    with pytest.raises(ShapeError, match="got Tensor"):
        plot_block_mask(torch.ones(4, 4, dtype=torch.bool))
