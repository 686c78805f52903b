// The training page's script: replays a run's stored probe attention step by step. It
// computes no attention and no score: the weights are the stored snapshots (whole numbers
// of 1/data.scale, the causal lower triangle row by row), the scores and losses are the
// metrics records; the layout is TRAINING_PAGE_DOC in selfattn/render/visual/training_view.py.
// Data reaches the page as text only (textContent, attributes), never as markup.
"use strict";

(function () {
  // matplotlib's viridis at 0, 0.1, ..., 1: the colours of `selfattn plot`'s heatmaps.
  const VIRIDIS = [
    "#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c",
    "#22a884", "#44bf70", "#7ad151", "#bddf26", "#fde725",
  ].map((hex) => [1, 3, 5].map((at) => parseInt(hex.slice(at, at + 2), 16)));
  const HIDDEN = [238, 241, 244]; // above the diagonal: later keys, hidden by the causal mask
  const PLAY_MS = 450; // per step while playing
  const CHART = { width: 480, height: 150, left: 40, right: 14, top: 22, bottom: 22 };
  const LOSS_SERIES = [ // [field, label, colour, dash]
    ["train_loss", "training", "#0969da", ""],
    ["val_loss", "validation", "#d1242f", ""],
    ["first_copy", "probe 1st copy", "#6e7781", "2 3"],
    ["second_copy", "probe repeat", "#1a7f37", "6 3"],
  ];

  const data = JSON.parse(document.getElementById("training-data").textContent);
  const heatmap = document.getElementById("heatmap");
  const SVG_NS = heatmap.namespaceURI; // the <svg>'s own namespace, so this file names no URL
  // A probe's token as the page shows it: a text run's space, newline and tab made visible.
  const VISIBLE = { " ": "␣", "\n": "↵", "\t": "⇥" };
  const tokens = data.tokens.map((t) => VISIBLE[t] || t);
  const n = tokens.length;
  const nLayers = data.run.n_layers;
  const nHeads = data.run.n_heads;
  const frames = data.frames;
  const metricsAt = new Map(data.metrics.map((m) => [m.step, m]));
  const repeatStart = data.offset + data.repeat; // the first token of the second copy
  const INDUCTION = data.score_fields.indexOf("induction");
  const PREVIOUS = data.score_fields.indexOf("previous_token");
  // The two halves of the induction circuit, as the Python side named them (the same heads
  // `selfattn plot --kind training` draws thick): by index, layer by layer.
  const inductionHeads = new Set(data.induction_heads.map(([layer, head]) => layer * data.run.n_heads + head));
  const previousHeads = new Set(data.previous_token_heads.map(([layer, head]) => layer * data.run.n_heads + head));
  const SCORE_CHARTS = [ // [element id, score index, heads drawn thick, their colour, what the chart shows]
    ["induction-chart", INDUCTION, inductionHeads, "#bc4c00",
      `induction score: chosen head blue, induction heads orange (dashed: ${data.threshold})`],
    ["previous-chart", PREVIOUS, previousHeads, "#8250df",
      `previous-token score: chosen head blue, previous-token heads purple (dashed: ${data.role_threshold})`],
  ];

  const controls = {
    slider: document.getElementById("step-slider"),
    label: document.getElementById("step-label"),
    play: document.getElementById("play"),
    layer: document.getElementById("layer"),
    head: document.getElementById("head"),
  };
  const state = {
    frame: frames.length - 1,
    layer: data.selected.layer,
    head: data.selected.head,
    hovered: null, // [query, key] under the pointer
    timer: null,
  };
  let cells = []; // the heatmap's <rect>s, in the stored order (row by row, lower triangle)
  const thumbs = []; // per head: {button, canvas, score, previous}
  const rows = []; // per head: the scores table's <tr>
  const markers = []; // the charts' step markers: {line, x}
  const scoreLines = []; // per score chart: {lines (per head, its polyline), thick, colour}

  function el(tag, attributes, text) {
    const element = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) element.setAttribute(name, String(value));
    if (text !== undefined) element.textContent = text;
    return element;
  }

  function svg(tag, attributes, text) {
    const element = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attributes || {})) element.setAttribute(name, String(value));
    if (text !== undefined) element.textContent = text;
    return element;
  }

  function headIndex(layer, head) {
    return layer * nHeads + head;
  }

  function headName(layer, head) {
    return `L${layer} H${head}`;
  }

  function colour(weight) {
    const at = Math.min(Math.max(weight, 0), 1) * (VIRIDIS.length - 1);
    const low = Math.floor(Math.min(at, VIRIDIS.length - 2));
    const t = at - low;
    return VIRIDIS[low].map((c, k) => Math.round(c + (VIRIDIS[low + 1][k] - c) * t));
  }

  function rgb(c) {
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  function weightText(stored) {
    return (stored / data.scale).toFixed(3);
  }

  function scoreText(value) {
    return typeof value === "number" ? value.toFixed(3) : "–";
  }

  function currentFrame() {
    return frames[state.frame];
  }

  function currentScores() {
    const record = metricsAt.get(currentFrame().step);
    return record ? record.heads : null;
  }

  function formed(index) {
    return inductionHeads.has(index);
  }

  // ---- controls -------------------------------------------------------------------

  function buildControls() {
    document.getElementById("title").textContent = data.title;
    document.getElementById("description").textContent = data.description;
    controls.slider.max = String(frames.length - 1);
    controls.slider.value = String(state.frame);
    controls.slider.addEventListener("input", () => setFrame(Number(controls.slider.value)));
    for (const [select, count, word] of [[controls.layer, nLayers, "layer"], [controls.head, nHeads, "head"]]) {
      for (let i = 0; i < count; i++) select.append(el("option", { value: i }, `${word} ${i}`));
    }
    controls.layer.addEventListener("change", () => selectHead(Number(controls.layer.value), state.head));
    controls.head.addEventListener("change", () => selectHead(state.layer, Number(controls.head.value)));
    controls.play.addEventListener("click", togglePlay);
    document.addEventListener("keydown", onKey);
  }

  function onKey(event) {
    const target = event.target;
    if (target === controls.slider || target.tagName === "SELECT") return; // they step themselves
    const moves = { ArrowLeft: state.frame - 1, ArrowRight: state.frame + 1, Home: 0, End: frames.length - 1 };
    if (event.key in moves) {
      event.preventDefault();
      stopPlaying();
      setFrame(moves[event.key]);
    }
  }

  function togglePlay() {
    if (state.timer !== null) {
      stopPlaying();
      return;
    }
    if (state.frame >= frames.length - 1) setFrame(0);
    controls.play.textContent = "❚❚ pause";
    state.timer = setInterval(() => {
      setFrame(state.frame + 1);
      if (state.frame >= frames.length - 1) stopPlaying(); // the last step stays on screen
    }, PLAY_MS);
  }

  function stopPlaying() {
    if (state.timer !== null) clearInterval(state.timer);
    state.timer = null;
    controls.play.textContent = "▶ play";
  }

  function setFrame(index) {
    state.frame = Math.min(Math.max(0, index | 0), frames.length - 1);
    controls.slider.value = String(state.frame);
    render();
  }

  function selectHead(layer, head) {
    state.layer = layer;
    state.head = head;
    render();
  }

  // ---- the heatmap ------------------------------------------------------------------

  function buildHeatmap() {
    const size = Math.max(6, Math.min(14, Math.floor(620 / n)));
    const widest = Math.max(...tokens.map((t) => t.length));
    const margin = 14 + 6 * Math.max(widest, String(n - 1).length);
    const width = margin + n * size + 4;
    heatmap.setAttribute("width", width);
    heatmap.setAttribute("height", width);
    heatmap.dataset.cellSize = String(size);
    const x = (j) => margin + j * size;
    const y = (i) => margin + i * size;
    heatmap.append(svg("polygon", { class: "hidden-part",
      points: `${x(0)},${y(0)} ${x(n)},${y(0)} ${x(n)},${y(n)}` }));
    for (let i = 0; i < n; i++) {
      const repeat = i >= repeatStart ? " repeat" : "";
      heatmap.append(svg("text", { class: `token query${repeat}`, x: margin - 4, y: y(i) + size / 2,
        "text-anchor": "end", "dominant-baseline": "central" }, tokens[i]));
      heatmap.append(svg("text", { class: `token key${repeat}`, x: x(i) + size / 2, y: margin - 4,
        "text-anchor": "start", transform: `rotate(-90 ${x(i) + size / 2} ${margin - 4})`,
        "dominant-baseline": "central" }, tokens[i]));
      for (let j = 0; j <= i; j++) {
        cells.push(svg("rect", { class: "cell", x: x(j), y: y(i), width: size, height: size,
          "data-query": i, "data-key": j }));
      }
    }
    heatmap.append(...cells);
    if (repeatStart > 0 && repeatStart < n) {
      heatmap.append(svg("line", { class: "separator", x1: x(repeatStart), x2: x(repeatStart), y1: y(repeatStart), y2: y(n) }));
      heatmap.append(svg("line", { class: "separator", x1: x(0), x2: x(repeatStart), y1: y(repeatStart), y2: y(repeatStart) }));
    }
    heatmap.addEventListener("mouseover", (event) => {
      const cell = event.target;
      if (!cell.classList || !cell.classList.contains("cell")) return;
      state.hovered = [Number(cell.dataset.query), Number(cell.dataset.key)];
      showReadout();
    });
  }

  function showReadout() {
    for (const cell of heatmap.querySelectorAll(".cell.hovered")) cell.classList.remove("hovered");
    if (state.hovered === null) return;
    const [i, j] = state.hovered;
    const cell = cells[(i * (i + 1)) / 2 + j];
    cell.classList.add("hovered");
    document.getElementById("cell-readout").textContent =
      `step ${currentFrame().step}, ${headName(state.layer, state.head)}: query ${i} '${tokens[i]}' → key ${j} ` +
      `'${tokens[j]}': ${cell.dataset.weight}`;
  }

  function renderHeatmap() {
    const weights = currentFrame().weights[headIndex(state.layer, state.head)];
    for (let k = 0; k < cells.length; k++) {
      cells[k].setAttribute("fill", rgb(colour(weights[k] / data.scale)));
      cells[k].dataset.weight = weightText(weights[k]);
    }
    document.getElementById("heatmap-title").textContent =
      `${headName(state.layer, state.head)} at step ${currentFrame().step}: attention on the probe`;
    showReadout();
  }

  // ---- every head: the pictures and the scores table ------------------------------------

  function buildHeads() {
    const grid = document.getElementById("head-grid");
    grid.style.gridTemplateColumns = `repeat(${nHeads}, minmax(0, 1fr))`;
    const body = document.querySelector("#scores tbody");
    for (let layer = 0; layer < nLayers; layer++) {
      for (let head = 0; head < nHeads; head++) {
        const canvas = el("canvas", { width: n, height: n, "aria-hidden": "true" });
        const score = el("span", { class: "thumb-score" });
        const previous = el("span", { class: "thumb-previous" });
        const button = el("button", { type: "button", class: "thumb", "data-layer": layer, "data-head": head,
          "aria-label": `show ${headName(layer, head)}` });
        button.append(canvas, el("span", {}, headName(layer, head)), score, previous);
        button.addEventListener("click", () => selectHead(layer, head));
        grid.append(button);
        thumbs.push({ button, canvas, score, previous });
        const row = el("tr", { "data-layer": layer, "data-head": head });
        row.append(el("th", {}, headName(layer, head)));
        for (const field of data.score_fields) row.append(el("td", { "data-field": field }));
        row.addEventListener("click", () => selectHead(layer, head));
        body.append(row);
        rows.push(row);
        const isFormed = formed(headIndex(layer, head));
        const isPrevious = previousHeads.has(headIndex(layer, head));
        button.classList.toggle("formed", isFormed);
        row.classList.toggle("formed", isFormed);
        button.classList.toggle("previous", isPrevious);
        row.classList.toggle("previous", isPrevious);
      }
    }
  }

  function renderHeads() {
    const frame = currentFrame();
    const scores = currentScores();
    thumbs.forEach((thumb, index) => {
      const context = thumb.canvas.getContext("2d");
      const image = context.createImageData(n, n);
      const weights = frame.weights[index];
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < n; j++) {
          const c = j <= i ? colour(weights[(i * (i + 1)) / 2 + j] / data.scale) : HIDDEN;
          image.data.set([c[0], c[1], c[2], 255], 4 * (i * n + j));
        }
      }
      context.putImageData(image, 0, 0);
      const selected = index === headIndex(state.layer, state.head);
      thumb.button.classList.toggle("selected", selected);
      thumb.button.setAttribute("aria-pressed", String(selected));
      thumb.score.textContent = `induction ${scoreText(scores ? scores[index][INDUCTION] : null)}`;
      thumb.previous.textContent = `prev. token ${scoreText(scores ? scores[index][PREVIOUS] : null)}`;
    });
    rows.forEach((row, index) => {
      row.classList.toggle("selected", index === headIndex(state.layer, state.head));
      data.score_fields.forEach((field, k) => {
        row.querySelector(`td[data-field="${field}"]`).textContent = scoreText(scores ? scores[index][k] : null);
      });
    });
  }

  // ---- the curves -----------------------------------------------------------------------

  function chart(element, series, low, high, extras) {
    const { width, height, left, right, top, bottom } = CHART;
    element.setAttribute("viewBox", `0 0 ${width} ${height}`);
    element.classList.add("chart");
    const steps = data.metrics.map((m) => m.step);
    const first = Math.min(0, ...steps);
    const last = Math.max(...steps, first + 1);
    const x = (step) => left + ((step - first) / (last - first)) * (width - left - right);
    const y = (value) => top + (1 - (value - low) / (high - low || 1)) * (height - top - bottom);
    element.append(svg("line", { class: "axis", x1: left, x2: left, y1: top, y2: height - bottom }));
    element.append(svg("line", { class: "axis", x1: left, x2: width - right, y1: height - bottom, y2: height - bottom }));
    for (const value of [low, (low + high) / 2, high]) {
      element.append(svg("text", { class: "tick", x: left - 4, y: y(value), "text-anchor": "end",
        "dominant-baseline": "central" }, value.toFixed(2)));
    }
    element.append(svg("text", { class: "tick", x: x(first), y: height - 6, "text-anchor": "start" }, `step ${first}`));
    element.append(svg("text", { class: "tick", x: x(last), y: height - 6, "text-anchor": "end" }, `step ${last}`));
    if (extras) extras(element, x, y);
    const lines = series.map((s) => {
      const points = data.metrics.filter((m) => typeof s.value(m) === "number").map((m) => `${x(m.step)},${y(s.value(m))}`);
      const line = svg("polyline", { class: `series ${s.cls || ""}`, points: points.join(" "), stroke: s.colour,
        "stroke-dasharray": s.dash || "none", "data-label": s.label });
      element.append(line);
      return line;
    });
    const marker = svg("line", { class: "marker", y1: top, y2: height - bottom });
    element.append(marker);
    markers.push({ line: marker, x });
    element.addEventListener("click", (event) => {
      // The stored step nearest to where the chart was clicked.
      const box = element.getBoundingClientRect();
      const at = ((event.clientX - box.left) / box.width) * width;
      let best = 0;
      frames.forEach((f, k) => { if (Math.abs(x(f.step) - at) < Math.abs(x(frames[best].step) - at)) best = k; });
      stopPlaying();
      setFrame(best);
    });
    return lines;
  }

  function buildCharts() {
    const losses = data.metrics.flatMap((m) => LOSS_SERIES.map(([field]) => m[field])).filter((v) => typeof v === "number");
    const low = losses.length ? Math.min(...losses) : 0;
    const high = losses.length ? Math.max(...losses) : 1;
    const lossChart = document.getElementById("loss-chart");
    chart(lossChart, LOSS_SERIES.map(([field, label, colour, dash]) => ({ value: (m) => m[field], label, colour, dash })),
      low, high, (element) => {
        let at = CHART.left;
        for (const [, label, colour, dash] of LOSS_SERIES) { // the key, in one row above the curves
          element.append(svg("line", { x1: at, x2: at + 16, y1: 10, y2: 10, stroke: colour, "stroke-width": 2,
            "stroke-dasharray": dash || "none" }));
          element.append(svg("text", { class: "key", x: at + 20, y: 10, "dominant-baseline": "central" }, label));
          at += 28 + 5.5 * label.length;
        }
      });
    for (const [id, score, thick, thickColour, key] of SCORE_CHARTS) {
      const threshold = score === INDUCTION ? data.threshold : data.role_threshold;
      const heads = [];
      for (let layer = 0; layer < nLayers; layer++) {
        for (let head = 0; head < nHeads; head++) {
          const index = headIndex(layer, head);
          heads.push({ value: (m) => m.heads[index][score], label: headName(layer, head), colour: "#8c959f", cls: "other" });
        }
      }
      const lines = chart(document.getElementById(id), heads, 0, 1, (element, x, y) => {
        element.append(svg("line", { class: "threshold", x1: CHART.left, x2: CHART.width - CHART.right,
          y1: y(threshold), y2: y(threshold) }));
        element.append(svg("text", { class: "key", x: CHART.left, y: 10, "dominant-baseline": "central" }, key));
        if (data.induction_step !== null) {
          element.append(svg("line", { class: "formed", x1: x(data.induction_step), x2: x(data.induction_step),
            y1: CHART.top, y2: CHART.height - CHART.bottom }));
        }
      });
      scoreLines.push({ lines, thick, colour: thickColour });
    }
  }

  function renderCharts() {
    const step = currentFrame().step;
    for (const { line, x } of markers) {
      line.setAttribute("x1", x(step));
      line.setAttribute("x2", x(step));
    }
    const chosen = headIndex(state.layer, state.head);
    for (const { lines, thick, colour } of scoreLines) {
      lines.forEach((line, index) => {
        line.classList.toggle("other", index !== chosen && !thick.has(index));
        line.classList.toggle("thick", thick.has(index));
        line.setAttribute("stroke", index === chosen ? "#0969da" : thick.has(index) ? colour : "#8c959f");
        if (index === chosen) line.parentNode.append(line); // drawn last: on top
      });
    }
  }

  function render() {
    const step = currentFrame().step;
    controls.label.textContent = `step ${step} of ${data.run.steps}`;
    controls.label.dataset.step = String(step);
    controls.layer.value = String(state.layer);
    controls.head.value = String(state.head);
    renderHeatmap();
    renderHeads();
    renderCharts();
  }

  buildControls();
  buildHeatmap();
  buildHeads();
  buildCharts();
  render();
})();
