"""`selfattn plot --training DIR --kind training` and `selfattn view --training DIR` on a real run.

The run is trained once for the module (60 steps of the induction task, a metrics line and
a probe snapshot every 10). The references are the run's own files read here with json and
safetensors (metrics.jsonl, training.json, the probe/ file names) and the training
package's reader ``read_snapshots``: what the picture and the page hold must be those
numbers, to the page's rounding.
"""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
import struct
from xml.etree import ElementTree

import numpy as np
import pytest
import torch
from browser import chromium, recorded_page

from selfattn.commands.explain_options import ExplainConfig
from selfattn.analysis.decoder_roles import DECODER_THRESHOLD
from selfattn.errors import OptionError, TrainingError
from selfattn.training import train
from selfattn.training.probe import read_snapshots
from selfattn.training.records import INDUCTION_FORMED
from selfattn.render.visual import PLOT_KINDS
from selfattn.render.visual.explorer import CONTENT_SECURITY_POLICY
from selfattn.render.visual.training_plot import training_figure
from selfattn.commands.training_pictures import read_run
from selfattn.commands.training_pictures import training_html
from selfattn.render.visual.training_view import WEIGHT_SCALE, kept_steps

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HEAD_LABEL = re.compile(r"L(\d+) H(\d+)")
ROUNDING = 0.5 / WEIGHT_SCALE + 1e-6  # the page keeps weights to 3 decimals


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("training") / "run"
    train("induction", out=folder, steps=60, log_every=10, checkpoint_every=60, progress=False, d_model=32)
    return folder


def metrics_of(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def model_size(folder) -> tuple[int, int]:
    config = json.loads((folder / "training.json").read_text())["config"]
    return config["n_layers"], config["n_heads"]


def first_formed(records) -> int | None:
    """The first logged step at which some head's induction score reaches 0.4, from the records."""
    return next((r["step"] for r in records if max(h["induction"] for h in r["heads"]) >= INDUCTION_FORMED), None)


def copy_with_formed_head(run_dir, tmp_path, layer=1, head=2, from_step=30, score=0.55, name="induction",
                          folder="formed"):
    """The run, with one head's ``name`` score raised to ``score`` from ``from_step`` on."""
    folder = tmp_path / folder
    shutil.copytree(run_dir, folder)
    records = metrics_of(run_dir)
    for record in records:
        for h in record["heads"]:
            if (h["layer"], h["head"]) == (layer, head) and record["step"] >= from_step:
                h[name] = score
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def final_previous_token_heads(records) -> set[tuple[int, int]]:
    """The heads whose previous-token score is at least 0.4 at the last step, from the records."""
    return {(h["layer"], h["head"]) for h in records[-1]["heads"] if h["previous_token"] >= DECODER_THRESHOLD}


def page_data(page_html: str) -> dict:
    found = re.search(r'<script type="application/json" id="training-data">(.*?)</script>', page_html, re.DOTALL)
    assert found, "the page embeds its data"
    return json.loads(found.group(1))


def unpacked(lower: list[int], n: int) -> np.ndarray:
    """A page's lower triangle (row by row, in thousandths) as an (n, n) matrix of weights."""
    rows, cols = np.tril_indices(n)
    matrix = np.zeros((n, n))
    matrix[rows, cols] = np.asarray(lower) / WEIGHT_SCALE
    return matrix


# ---- the picture ---------------------------------------------------------------------------


def test_training_is_a_plot_kind():
    assert "training" in PLOT_KINDS


def test_plot_writes_a_png_and_an_svg(run_cli, run_dir, tmp_path):
    png, svg = tmp_path / "training.png", tmp_path / "training.svg"
    for path in (png, svg):
        status, out, err = run_cli("plot", "--training", str(run_dir), "--kind", "training", "-o", str(path))
        assert (status, err, out) == (0, "", f"wrote {path}\n")
    data = png.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 800 and height > 600
    root = ElementTree.parse(svg).getroot()
    assert root.tag.endswith("svg")
    texts = {"".join(t.itertext()).strip() for t in root.iter() if t.tag.endswith("text")}
    n_layers, n_heads = model_size(run_dir)
    assert {f"L{l} H{h}" for l in range(n_layers) for h in range(n_heads)} <= texts  # every head in the legend
    assert any("induction" in t and "60 steps" in t for t in texts), "the title names the task and the steps"


def test_one_induction_line_per_head_with_the_metrics_values(run_cli, run_dir, tmp_path, drawn):
    assert run_cli("plot", "--training", str(run_dir), "--kind", "training", "-o", str(tmp_path / "t.png"))[0] == 0
    loss_ax, heads_ax = drawn[0].axes[:2]
    records = metrics_of(run_dir)
    steps = [r["step"] for r in records]
    assert steps == [10, 20, 30, 40, 50, 60]
    lines = {line.get_label(): line for line in heads_ax.get_lines() if HEAD_LABEL.fullmatch(line.get_label())}
    n_layers, n_heads = model_size(run_dir)
    assert len(lines) == n_layers * n_heads
    for layer in range(n_layers):
        for head in range(n_heads):
            line = lines[f"L{layer} H{head}"]
            expected = [next(h["induction"] for h in r["heads"] if (h["layer"], h["head"]) == (layer, head))
                        for r in records]
            np.testing.assert_array_equal(line.get_xdata(), steps)
            np.testing.assert_allclose(line.get_ydata(), expected, rtol=0, atol=1e-12)
    shown = {line.get_label(): line for line in loss_ax.get_lines()}
    np.testing.assert_allclose(shown["training loss"].get_ydata(), [r["train_loss"] for r in records], rtol=1e-12)
    np.testing.assert_allclose(shown["validation loss"].get_ydata(), [r["val_loss"] for r in records], rtol=1e-12)
    np.testing.assert_allclose(shown["probe: repeated copy"].get_ydata(),
                               [r["probe_loss"]["second_copy"] for r in records], rtol=1e-12)
    threshold = [line for line in heads_ax.get_lines() if line.get_label().startswith("threshold")]
    assert len(threshold) == 1 and threshold[0].get_linestyle() == "--"
    np.testing.assert_allclose(threshold[0].get_ydata(), [INDUCTION_FORMED, INDUCTION_FORMED])
    assert heads_ax.get_shared_x_axes().joined(loss_ax, heads_ax)


def vertical_lines(ax) -> list[float]:
    xs = [line.get_xdata() for line in ax.get_lines()]
    return [float(x[0]) for x in xs if len(x) == 2 and x[0] == x[1]]


def test_the_formed_head_is_thick_and_the_step_it_formed_is_marked(run_dir, tmp_path):
    plain = training_figure(read_run(run_dir))
    assert first_formed(metrics_of(run_dir)) is None, "60 tiny steps form no induction head"
    assert [vertical_lines(ax) for ax in plain.axes[:2]] == [[], []]
    assert "no head reached induction 0.4 by step 60" in plain.axes[0].get_title()

    folder = copy_with_formed_head(run_dir, tmp_path, layer=1, head=2, from_step=30)
    assert first_formed(metrics_of(folder)) == 30
    figure = training_figure(read_run(folder))
    loss_ax, heads_ax = figure.axes[:2]
    assert vertical_lines(loss_ax) == [30.0] and vertical_lines(heads_ax) == [30.0]
    widths = {line.get_label(): line.get_linewidth() for line in heads_ax.get_lines() if HEAD_LABEL.fullmatch(line.get_label())}
    assert widths.pop("L1 H2") > max(widths.values())
    assert "formed at step 30" in loss_ax.get_title() and "L1 H2" in loss_ax.get_title()


def test_a_third_panel_holds_every_heads_previous_token_score(run_dir, tmp_path):
    """The other half of the circuit: one line per head, its y data the metrics' previous_token."""
    folder = copy_with_formed_head(run_dir, tmp_path, layer=0, head=1, from_step=40, score=0.47,
                                   name="previous_token", folder="previous")
    records = metrics_of(folder)
    assert final_previous_token_heads(records) == {(0, 1)}
    figure = training_figure(read_run(folder))
    assert len(figure.axes) == 3
    loss_ax, induction_ax, previous_ax = figure.axes
    assert "previous-token" in previous_ax.get_ylabel() and "induction" in induction_ax.get_ylabel()
    assert previous_ax.get_shared_x_axes().joined(loss_ax, previous_ax)
    lines = {line.get_label(): line for line in previous_ax.get_lines() if HEAD_LABEL.fullmatch(line.get_label())}
    n_layers, n_heads = model_size(folder)
    assert set(lines) == {f"L{l} H{h}" for l in range(n_layers) for h in range(n_heads)}
    steps = [r["step"] for r in records]
    for label, line in lines.items():
        layer, head = map(int, HEAD_LABEL.fullmatch(label).groups())
        expected = [next(h["previous_token"] for h in r["heads"] if (h["layer"], h["head"]) == (layer, head))
                    for r in records]
        np.testing.assert_array_equal(line.get_xdata(), steps)
        np.testing.assert_allclose(line.get_ydata(), expected, rtol=0, atol=1e-12)
    widths = {label: line.get_linewidth() for label, line in lines.items()}
    assert widths.pop("L0 H1") > max(widths.values()), "the head that ends at 0.4 or above is thick"
    threshold = [line for line in previous_ax.get_lines() if line.get_label().startswith("threshold")]
    assert len(threshold) == 1
    np.testing.assert_allclose(threshold[0].get_ydata(), [DECODER_THRESHOLD, DECODER_THRESHOLD])
    colour = {label: line.get_color() for label, line in lines.items()}
    shown = {line.get_label(): line.get_color() for line in induction_ax.get_lines() if line.get_label() in colour}
    assert shown == colour, "a head keeps its colour in both panels"
    title = loss_ax.get_title()
    assert "previous-token heads at step 60, score ≥ 0.4: L0 H1 (first at step 40)" in title


def test_no_previous_token_head_says_the_highest_score(run_dir):
    records = metrics_of(run_dir)
    assert final_previous_token_heads(records) == set(), "60 tiny steps make no previous-token head"
    best = max(records[-1]["heads"], key=lambda h: h["previous_token"])
    title = training_figure(read_run(run_dir)).axes[0].get_title()
    assert (f"no previous-token head at step 60: the highest previous-token score is "
            f"L{best['layer']} H{best['head']}'s, {best['previous_token']:.2f}") in title
    widths = {line.get_linewidth() for line in training_figure(read_run(run_dir)).axes[2].get_lines()
              if HEAD_LABEL.fullmatch(line.get_label())}
    assert len(widths) == 1, "no head is drawn thick"


def test_the_legends_sit_beside_the_axes_and_cover_no_curve(run_dir, tmp_path):
    figure = training_figure(read_run(copy_with_formed_head(run_dir, tmp_path)))
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    for ax in figure.axes:
        legend = ax.get_legend()
        assert legend is not None
        box, frame = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
        assert box.x0 >= frame.x1, f"{ax.get_ylabel()}: the legend starts right of the axes"
        assert box.x1 <= figure.bbox.x1 + 1, "and stays inside the figure"
    loss_ax = figure.axes[0]
    repeat = next(line for line in loss_ax.get_lines() if line.get_label() == "probe: repeated copy")
    points = loss_ax.transData.transform(np.column_stack([repeat.get_xdata(), repeat.get_ydata()]))
    legend_box = loss_ax.get_legend().get_window_extent(renderer)
    assert not any(legend_box.contains(x, y) for x, y in points), "no point of the repeat's curve lies under the legend"


def test_the_title_names_the_task_once_when_the_folder_is_named_after_it(run_dir, tmp_path):
    folder = tmp_path / "induction"
    shutil.copytree(run_dir, folder)
    first_line = training_figure(read_run(folder)).axes[0].get_title().splitlines()[0]
    n_layers, n_heads = model_size(run_dir)
    assert first_line == f"Training run induction, 60 steps, {n_layers} layers × {n_heads} heads"
    assert first_line.count("induction") == 1
    words = re.findall(r"\w+", first_line)
    assert all(a != b for a, b in zip(words, words[1:])), "no word said twice in a row"
    other = training_figure(read_run(run_dir)).axes[0].get_title().splitlines()[0]
    assert other.startswith(f"Training run {run_dir.name}: induction, 60 steps")


# ---- the page ------------------------------------------------------------------------------


def test_page_embeds_every_snapshot_step_with_its_weights(run_dir):
    data = page_data(training_html(run_dir))
    stored = sorted(int(p.stem.split("-")[1]) for p in (run_dir / "probe").glob("step-*.safetensors"))
    assert [frame["step"] for frame in data["frames"]] == stored == [10, 20, 30, 40, 50, 60]
    probe = json.loads((run_dir / "probe.json").read_text())
    assert data["tokens"] == probe["tokens"] and data["repeat"] == probe["repeat"]
    n = len(probe["ids"])
    n_layers, n_heads = model_size(run_dir)
    for frame, (step, weights) in zip(data["frames"], read_snapshots(run_dir)):
        assert frame["step"] == step and weights.shape == (n_layers, n_heads, n, n)
        assert len(frame["weights"]) == n_layers * n_heads
        assert torch.all(weights.triu(1) == 0), "a causal model: nothing above the diagonal is left out"
        for index, lower in enumerate(frame["weights"]):
            expected = weights[divmod(index, n_heads)].double().numpy()
            np.testing.assert_allclose(unpacked(lower, n), expected, rtol=0, atol=ROUNDING)


def test_page_scores_and_losses_are_the_metrics_records(run_dir):
    data = page_data(training_html(run_dir))
    records = metrics_of(run_dir)
    assert [m["step"] for m in data["metrics"]] == [r["step"] for r in records]
    for shown, record in zip(data["metrics"], records):
        assert shown["train_loss"] == pytest.approx(record["train_loss"], abs=1e-4)
        assert shown["second_copy"] == pytest.approx(record["probe_loss"]["second_copy"], abs=1e-4)
        for h in record["heads"]:
            row = shown["heads"][h["layer"] * data["run"]["n_heads"] + h["head"]]
            assert row == pytest.approx([h["induction"], h["previous_token"], h["first_token"], h["entropy"]], abs=1e-4)
    best = max(records[-1]["heads"], key=lambda h: h["induction"])
    assert data["selected"] == {"layer": best["layer"], "head": best["head"]}, "opens on the best induction head"
    assert page_data(training_html(run_dir, layer=0, head=1))["selected"] == {"layer": 0, "head": 1}
    best_in_0 = max((h for h in records[-1]["heads"] if h["layer"] == 0), key=lambda h: h["induction"])
    assert page_data(training_html(run_dir, layer=0))["selected"] == {"layer": 0, "head": best_in_0["head"]}


def test_a_long_run_keeps_evenly_spaced_steps_within_the_budget(run_dir, monkeypatch):
    steps = list(range(25, 100_001, 25))  # 4000 stored steps
    kept = kept_steps(steps, per_step=16_128, formed=275, budget=100 * 16_128)
    assert len(kept) == 101 and kept[0] == 25 and kept[-1] == 100_000 and 275 in kept
    gaps = np.diff([k for k in kept if k != 275])
    assert gaps.max() - gaps.min() <= 25, "evenly spaced, up to one stored step"
    assert kept_steps([10, 20, 30], per_step=10, formed=None, budget=30) == [10, 20, 30]

    from selfattn.render.visual import training_view

    monkeypatch.setattr(training_view, "MAX_PAGE_WEIGHTS", 1)  # room for the least: the first and the last
    data = page_data(training_html(run_dir))
    assert [frame["step"] for frame in data["frames"]] == [10, 60]
    assert "holds 2 of the 6 stored steps" in data["description"]


def test_page_fetches_nothing_and_names_no_url(run_dir):
    page_html = training_html(run_dir)
    assert "http://" not in page_html and "https://" not in page_html
    assert "<link" not in page_html.lower() and "url(" not in page_html and "@import" not in page_html
    assert re.search(r"<script[^>]*\ssrc\s*=", page_html, re.IGNORECASE) is None
    assert f'content="{html_lib.escape(CONTENT_SECURITY_POLICY)}"' in page_html
    script = page_html.rsplit("<script>", 1)[1]
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


def cell_weight(page, query: int, key: int) -> float:
    return float(page.get_attribute(f'#heatmap rect.cell[data-query="{query}"][data-key="{key}"]', "data-weight"))


def test_slider_keys_and_head_grid_replay_the_stored_attention(browser, run_dir):
    snapshots = read_snapshots(run_dir)
    change = (snapshots[-1][1] - snapshots[0][1]).abs()  # (layers, heads, n, n)
    layer, head, query, key = np.unravel_index(int(change.argmax()), change.shape)  # the cell that changed most
    layer, head, query, key = int(layer), int(head), int(query), int(key)
    first, last = snapshots[0][1][layer, head], snapshots[-1][1][layer, head]  # (n, n) each
    assert key <= query and abs(float(last[query, key] - first[query, key])) > 4 * ROUNDING, "a change the page shows"
    other = (0, 3) if (layer, head) != (0, 3) else (1, 1)
    with recorded_page(browser, viewport={"width": 1400, "height": 1000}) as page:
        page.load(training_html(run_dir, layer=layer, head=head))
        assert page.text_content("#step-label") == "step 60 of 60"  # opens on the last step
        assert cell_weight(page, query, key) == pytest.approx(float(last[query, key]), abs=ROUNDING)

        page.eval_on_selector("#step-slider", "s => { s.value = '0'; s.dispatchEvent(new Event('input')); }")
        assert page.text_content("#step-label") == "step 10 of 60"
        assert cell_weight(page, query, key) == pytest.approx(float(first[query, key]), abs=ROUNDING)
        assert page.text_content("#heatmap-title").startswith(f"L{layer} H{head} at step 10")

        page.click("h1")  # focus off the slider: the arrows step the page
        page.keyboard.press("ArrowRight")
        assert page.text_content("#step-label") == "step 20 of 60"
        assert cell_weight(page, query, key) == pytest.approx(float(snapshots[1][1][layer, head, query, key]), abs=ROUNDING)
        page.keyboard.press("End")
        assert page.text_content("#step-label") == "step 60 of 60"
        assert page.eval_on_selector("#step-slider", "s => s.value") == str(len(snapshots) - 1)

        page.click(f'#head-grid button[data-layer="{other[0]}"][data-head="{other[1]}"]')
        assert page.text_content("#heatmap-title").startswith(f"L{other[0]} H{other[1]} at step 60")
        assert page.eval_on_selector("#head", "s => s.value") == str(other[1])
        assert cell_weight(page, query, key) == pytest.approx(float(snapshots[-1][1][other][query, key]), abs=ROUNDING)
        induction = next(h["induction"] for h in metrics_of(run_dir)[-1]["heads"] if (h["layer"], h["head"]) == other)
        shown = page.text_content('#scores tr.selected td[data-field="induction"]')
        assert float(shown) == pytest.approx(induction, abs=5e-4)
        assert page.eval_on_selector_all("#heatmap rect.cell", "cells => cells.length") == sum(range(1, first.shape[-1] + 1))

        page.hover(f'#heatmap rect.cell[data-query="{query}"][data-key="{key}"]')
        readout = page.text_content("#cell-readout")
        assert readout.startswith(f"step 60, L{other[0]} H{other[1]}: query {query} ")
        assert float(readout.rsplit(": ", 1)[1]) == pytest.approx(float(snapshots[-1][1][other][query, key]), abs=ROUNDING)

        page.keyboard.press("Home")
        page.click("#play")  # plays on by itself, a step at a time, and stops at the last
        page.wait_for_function("() => document.getElementById('step-label').dataset.step === '30'", timeout=5000)
        page.wait_for_function("() => document.getElementById('step-label').dataset.step === '60'", timeout=10000)
        assert page.text_content("#play") == "▶ play"
        page.assert_quiet()


CHART_TOP, CHART_PLOT_HEIGHT = 22, 150 - 22 - 22  # training.js's CHART: top, height - top - bottom


def chart_values(points: str) -> list[float]:
    """A 0-to-1 chart's polyline points as the values they plot."""
    return [1 - (float(pair.split(",")[1]) - CHART_TOP) / CHART_PLOT_HEIGHT for pair in points.split()]


def test_page_shows_both_halves_of_the_circuit(browser, run_dir, tmp_path):
    previous = copy_with_formed_head(run_dir, tmp_path, layer=0, head=1, from_step=40, score=0.47,
                                     name="previous_token", folder="previous")
    folder = copy_with_formed_head(previous, tmp_path, layer=1, head=2, from_step=30, folder="both")
    records = metrics_of(folder)
    data = page_data(training_html(folder, layer=1, head=0))
    assert data["previous_token_heads"] == [list(h) for h in sorted(final_previous_token_heads(records))] == [[0, 1]]
    assert data["induction_heads"] == [[1, 2]] and data["role_threshold"] == DECODER_THRESHOLD
    assert "previous-token heads at step 60, score ≥ 0.4: L0 H1 (first at step 40)" in data["description"]
    n_layers, n_heads = model_size(folder)
    with recorded_page(browser, viewport={"width": 1400, "height": 1000}) as page:
        page.load(training_html(folder, layer=1, head=0))
        for chart, score, thick in (("#previous-chart", "previous_token", ["L0 H1"]), ("#induction-chart", "induction", ["L1 H2"])):
            lines = page.eval_on_selector_all(f"{chart} polyline.series", """lines => lines.map(l => ({
                label: l.dataset.label, points: l.getAttribute('points'), thick: l.classList.contains('thick')}))""")
            assert sorted(line["label"] for line in lines) == sorted(f"L{l} H{h}" for l in range(n_layers) for h in range(n_heads))
            assert [line["label"] for line in lines if line["thick"]] == thick
            for line in lines:
                layer, head = map(int, HEAD_LABEL.fullmatch(line["label"]).groups())
                expected = [next(h[score] for h in r["heads"] if (h["layer"], h["head"]) == (layer, head)) for r in records]
                np.testing.assert_allclose(chart_values(line["points"]), expected, rtol=0, atol=1e-3)
        thumb = '#head-grid button[data-layer="0"][data-head="1"]'
        assert page.text_content(f"{thumb} .thumb-previous") == "prev. token 0.470"
        assert "previous" in page.get_attribute(thumb, "class")
        assert "previous" in page.get_attribute('#scores tr[data-layer="0"][data-head="1"]', "class")
        page.assert_quiet()


# ---- the command line ------------------------------------------------------------------------


def test_view_writes_the_page(run_cli, run_dir, tmp_path):
    path = tmp_path / "training.html"
    status, out, err = run_cli("view", "--training", str(run_dir), "--layer", "0", "--head", "2", "-o", str(path))
    assert (status, err, out) == (0, "", f"wrote {path}\n")
    assert page_data(path.read_text(encoding="utf-8"))["selected"] == {"layer": 0, "head": 2}


@pytest.fixture
def broken_runs(run_dir, tmp_path):
    """Folders that hold no usable run: empty, a file, no logged step, no probe attention."""
    empty = tmp_path / "empty"
    empty.mkdir()
    unlogged = tmp_path / "unlogged"
    shutil.copytree(run_dir, unlogged)
    (unlogged / "metrics.jsonl").write_text("")
    no_probe = tmp_path / "no-probe"
    shutil.copytree(run_dir, no_probe)
    shutil.rmtree(no_probe / "probe")
    return {"empty": empty, "file": run_dir / "probe.json", "missing": tmp_path / "nowhere",
            "unlogged": unlogged, "no-probe": no_probe, "run": run_dir}


@pytest.mark.parametrize("argv, words", [
    (["plot", "--kind", "training", "-o", "OUT.png"], "give its folder with --training DIR"),
    (["plot", "--training", "{run}", "--kind", "heatmap", "-o", "OUT.png"], "--training goes with --kind training"),
    (["plot", "--training", "{missing}", "--kind", "training", "-o", "OUT.png"], "does not exist"),
    (["plot", "--training", "{empty}", "--kind", "training", "-o", "OUT.png"], "holds no training run"),
    (["plot", "--training", "{file}", "--kind", "training", "-o", "OUT.png"], "is a file"),
    (["plot", "--training", "{unlogged}", "--kind", "training", "-o", "OUT.png"], "logged no step"),
    (["plot", "--training", "{run}", "--kind", "training", "--model", "gpt2", "-o", "OUT.png"], "does not take --model"),
    (["plot", "the", "cat", "--training", "{run}", "--kind", "training", "--layer", "1", "-o", "OUT.png"],
     "does not take a sentence, --layer"),
    (["plot", "--training", "{run}", "--kind", "training", "-o", "OUT.pdf"], "use .png or .svg"),
    (["view", "--training", "{missing}", "-o", "OUT.html"], "does not exist"),
    (["view", "--training", "{no-probe}", "-o", "OUT.html"], "stored no probe attention"),
    (["view", "--training", "{run}", "--head", "7", "-o", "OUT.html"], "--head 7 is out of range"),
    (["view", "--training", "{run}", "--variant", "causal", "--precision", "2", "-o", "OUT.html"],
     "does not take --variant, --precision"),
    (["view", "--training", "{run}", "-o", "OUT.png"], "use .html or .htm"),
])
def test_mistakes_are_one_line_and_status_2(run_cli, broken_runs, tmp_path, argv, words):
    out_stem = tmp_path / "picture"
    argv = [a.format(**broken_runs) if a.startswith("{") else a.replace("OUT", str(out_stem)) for a in argv]
    status, out, err = run_cli(*argv)
    assert (status, out) == (2, ""), err
    assert err.startswith("selfattn: error: ") and err.count("\n") == 1, err
    assert words in err, err
    assert list(tmp_path.glob("picture*")) == [], "nothing is written"


def test_library_errors_are_typed(run_dir, tmp_path):
    from selfattn.commands.plot import plot

    with pytest.raises(OptionError, match="--training DIR"):
        plot(ExplainConfig(), "training", str(tmp_path / "x.png"))
    with pytest.raises(TrainingError, match="does not exist"):
        training_html(tmp_path / "nowhere")
    with pytest.raises(OptionError, match="--layer 5"):
        training_html(run_dir, layer=5)
    assert issubclass(TrainingError, ValueError) and issubclass(OptionError, ValueError)


def test_help_says_what_training_takes(run_cli):
    status, out, _ = run_cli("plot", "--help")
    words = " ".join(out.split())  # help wraps to the terminal
    assert status == 0 and "--training DIR" in words and "are refused with it" in words
    status, out, _ = run_cli("view", "--help")
    words = " ".join(out.split())
    assert status == 0 and "--training DIR" in words and "(default: the best induction head)" in words
    assert "--precision are refused with it" in words
