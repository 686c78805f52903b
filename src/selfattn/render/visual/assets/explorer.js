// The attention explorer's page script. It draws numbers it is given and computes no
// attention itself: every value comes from the JSON in #explorer-data (the layout is
// EXPLORER_DATA_DOC in selfattn/render/visual/explorer_data.py), already rounded to
// data.precision, and is printed with toFixed(data.precision) (toExponential from 1e10 up),
// as `selfattn explain` prints.
// Data reaches the page as text only (textContent, attributes), never as markup.
"use strict";

(function () {
  // A line's width and opacity grow with r = weight / (the largest weight of its row, in its
  // head): r = 1 draws MAX_WIDTH px wide and opaque, r near 0 draws MIN_WIDTH px at
  // MIN_OPACITY. Scaled to the row, 0.11 and 0.20 look different even when no weight is
  // near 1. With all heads overlaid, every head shares one absolute scale instead: r is the
  // weight itself, on 0..1, so an untrained head whose weights are all near 1/n draws
  // faint lines, and a head that is sure of one key draws the strongest line of all.
  // This is display only: the weights themselves come from the data, unchanged.
  // The numbers are on the svg as data-min-width, data-max-width and data-min-opacity.
  const MIN_WIDTH = 0.5;
  const MAX_WIDTH = 8;
  const MIN_OPACITY = 0.15;
  const LEGEND_FRACTIONS = [1, 0.5, 0.25, 0.1]; // the sample lines of the key, as r
  const SCIENTIFIC_FROM = 1e10; // as selfattn.formatting.SCIENTIFIC_FROM and SCIENTIFIC_BELOW
  const SCIENTIFIC_BELOW = 1e-10;
  const ROW_HEIGHT = 20; // px per token: long inputs grow the view, which then scrolls
  const TOP = 34; // px above the first token, for the column titles
  const GAP = 220; // px between the query column and the key column
  const PAD = 10;
  // One colour per head, in order; more heads than colours reuse them.
  const PALETTE = [
    "#0969da", "#d1242f", "#1a7f37", "#8250df", "#bc4c00", "#0598bc", "#bf3989", "#6e7781",
    "#9a6700", "#4d2d8c", "#116329", "#a40e26", "#0550ae", "#953800", "#57606a", "#ff8182",
  ];

  const data = JSON.parse(document.getElementById("explorer-data").textContent);
  const tokens = data.tokens;
  // How each token is shown: a model's tokens as they read ("␣cat" for "Ġcat"); the
  // vocabulary's own spelling stays in the tooltip and the labels for screen readers.
  const labels = data.labels || tokens;
  const n = tokens.length;
  const view = document.getElementById("head-view");
  // The namespace of the <svg> the HTML parser made, so this file names no URL.
  const SVG_NS = view.namespaceURI;

  const controls = {
    layer: document.getElementById("layer"),
    head: document.getElementById("head"),
    allHeads: document.getElementById("all-heads"),
    legend: document.getElementById("legend"),
  };
  const panel = document.getElementById("step-panel");

  const selected = data.selected || {};
  const state = {
    layer: clamp(selected.layer || 0, data.layers.length),
    head: 0,
    query: clamp(data.query || 0, n),
    overlay: false,
  };
  state.head = clamp(selected.head || 0, currentLayer().heads.length);

  let queryTokens = [];
  let keyTokens = [];
  let linesGroup = null;
  let lineStart = 0; // x where lines leave the query column
  let lineEnd = 0; // x where they reach the key column

  function clamp(value, count) {
    return Math.min(Math.max(0, value | 0), Math.max(0, count - 1));
  }

  function currentLayer() {
    return data.layers[state.layer];
  }

  function currentHead() {
    return currentLayer().heads[state.head];
  }

  // visible(i, j): whether query i may see key j, or null when nothing is hidden. A model's
  // layer carries its own mask (causal, a sliding window) as one range of keys per query; a
  // toy page has one n x n mask.
  function currentVisible() {
    const layer = currentLayer();
    if ("mask_ranges" in layer) {
      const ranges = layer.mask_ranges;
      return ranges ? (i, j) => j >= ranges[i][0] && j < ranges[i][1] : null;
    }
    const mask = "mask" in layer ? layer.mask : data.mask;
    return mask ? (i, j) => Boolean(mask[i][j]) : null;
  }

  // The vocabulary's spelling beside the shown label, when they differ.
  function spelled(i) {
    return labels[i] === tokens[i] ? labels[i] : `${labels[i]} (token ${JSON.stringify(tokens[i])})`;
  }

  function colourOf(h) {
    return PALETTE[h % PALETTE.length];
  }

  function format(value) {
    // "-inf", "inf" and "nan" arrive as strings (JSON has no such numbers). From 1e10 up (and
    // below 1e-10, 0 aside) a number is written 1.0461e+29, as explain's tables write it.
    if (typeof value !== "number") return String(value);
    const size = Math.abs(value);
    const wide = size >= SCIENTIFIC_FROM || (size > 0 && size < SCIENTIFIC_BELOW);
    return wide ? value.toExponential(data.precision) : value.toFixed(data.precision);
  }

  function html(tag, attributes, text) {
    const element = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) element.setAttribute(name, value);
    if (text !== undefined) element.textContent = text;
    return element;
  }

  function svg(tag, attributes, text) {
    const element = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attributes || {})) element.setAttribute(name, String(value));
    if (text !== undefined) element.textContent = text;
    return element;
  }

  // Width and opacity of a line whose weight is ``relative`` times its row's largest.
  function lineStyle(relative) {
    return {
      width: MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * relative,
      opacity: MIN_OPACITY + (1 - MIN_OPACITY) * relative,
    };
  }

  function largest(row) {
    return row.reduce((most, weight) => (typeof weight === "number" && weight > most ? weight : most), 0);
  }

  function rowY(i) {
    return TOP + i * ROW_HEIGHT + ROW_HEIGHT / 2;
  }

  // ---- header and controls -------------------------------------------------------

  function buildHeader() {
    document.getElementById("title").textContent = data.title || "selfattn explorer";
    document.getElementById("description").textContent = data.description || "";
  }

  function fillOptions(select, names) {
    select.replaceChildren(...names.map((name, index) => html("option", { value: String(index) }, name)));
  }

  function buildControls() {
    fillOptions(controls.layer, data.layers.map((layer, index) => layer.name || "layer " + index));
    controls.layer.value = String(state.layer);
    const oneLayer = data.layers.length < 2;
    controls.layer.disabled = oneLayer;
    document.getElementById("layer-control").hidden = oneLayer;
    fillHeadOptions();

    controls.layer.addEventListener("change", () => {
      state.layer = clamp(Number(controls.layer.value), data.layers.length);
      state.head = clamp(state.head, currentLayer().heads.length);
      fillHeadOptions();
      render();
    });
    controls.head.addEventListener("change", () => {
      state.head = clamp(Number(controls.head.value), currentLayer().heads.length);
      render();
    });
    controls.allHeads.addEventListener("change", () => {
      state.overlay = controls.allHeads.checked;
      render();
    });
  }

  function fillHeadOptions() {
    const heads = currentLayer().heads;
    fillOptions(controls.head, heads.map((head, index) => head.name || "head " + index));
    controls.head.value = String(state.head);
    controls.head.disabled = heads.length < 2;
  }

  function renderLegend() {
    controls.legend.hidden = !state.overlay;
    if (!state.overlay) {
      controls.legend.replaceChildren();
      return;
    }
    controls.legend.replaceChildren(
      ...currentLayer().heads.map((head, h) => {
        const item = html("li", { "data-head": String(h) });
        const swatch = html("span", { class: "swatch", "aria-hidden": "true" });
        swatch.style.background = colourOf(h);
        item.append(swatch, document.createTextNode(head.name || "head " + h));
        return item;
      })
    );
  }

  // ---- head view -----------------------------------------------------------------

  // A sample line's label: a fraction of the row's largest weight, or (heads overlaid) the weight itself.
  function sampleLabel(relative, overlaid) {
    if (overlaid) return `weight ${relative}`;
    return relative === 1 ? "largest" : `${Math.round(relative * 100)}%`;
  }

  // The key to the lines: a short sample line for each fraction of the row's largest weight
  // (renderLineLegend relabels them when the heads are overlaid).
  function buildLineLegend() {
    const samples = document.getElementById("line-samples");
    samples.setAttribute("height", "20");
    samples.setAttribute("width", "400");
    let x = 4;
    for (const relative of LEGEND_FRACTIONS) {
      const style = lineStyle(relative);
      samples.append(
        svg("line", {
          class: "legend-line", "data-relative": relative, x1: x, y1: 10, x2: x + 34, y2: 10,
          "stroke-width": style.width, "stroke-opacity": style.opacity,
        })
      );
      const label = svg("text", { class: "legend-label", x: x + 42, y: 10, "dominant-baseline": "middle" },
        sampleLabel(relative, true));
      samples.append(label);
      const overlaidWidth = label.getComputedTextLength();
      label.textContent = sampleLabel(relative, false);
      // The next sample starts past the longer of the label's two texts.
      x += 42 + Math.max(overlaidWidth, label.getComputedTextLength()) + 18;
    }
    samples.setAttribute("width", String(Math.ceil(x)));
  }

  function buildHeadView() {
    view.setAttribute("data-min-width", String(MIN_WIDTH));
    view.setAttribute("data-max-width", String(MAX_WIDTH));
    view.setAttribute("data-min-opacity", String(MIN_OPACITY));
    const columnTitles = svg("g");
    linesGroup = svg("g", { class: "lines" });
    const queryColumn = svg("g", { class: "queries" });
    const keyColumn = svg("g", { class: "keys" });
    view.replaceChildren(columnTitles, linesGroup, queryColumn, keyColumn);

    queryTokens = tokens.map((token, i) => tokenElement(i, "query", queryColumn));
    keyTokens = tokens.map((token, i) => tokenElement(i, "key", keyColumn));

    // Measure the drawn labels so that long tokens push the columns apart instead of
    // running into the lines.
    const widest = (elements) => elements.reduce((most, el) => Math.max(most, el.getComputedTextLength()), 0);
    const leftX = PAD + Math.max(60, widest(queryTokens));
    const rightX = leftX + GAP;
    const width = rightX + Math.max(60, widest(keyTokens)) + PAD;
    const height = TOP + n * ROW_HEIGHT + PAD;
    queryTokens.forEach((el) => el.setAttribute("x", String(leftX)));
    keyTokens.forEach((el) => el.setAttribute("x", String(rightX)));
    columnTitles.append(
      svg("text", { class: "column-title", x: leftX, y: 16, "text-anchor": "end" }, "queries"),
      svg("text", { class: "column-title", x: rightX, y: 16 }, "keys")
    );
    view.setAttribute("width", String(width));
    view.setAttribute("height", String(height));
    view.setAttribute("viewBox", `0 0 ${width} ${height}`);
    lineStart = leftX + 6;
    lineEnd = rightX - 6;

    view.addEventListener("click", (event) => {
      const token = event.target.closest(".token");
      if (token) selectQuery(Number(token.dataset.index), false);
    });
    view.addEventListener("mouseover", (event) => {
      const token = event.target.closest(".token.query");
      if (token && Number(token.dataset.index) !== state.query) selectQuery(Number(token.dataset.index), false);
    });
    view.addEventListener("keydown", onKey);
  }

  // One token's label in ``column``; where the label is not the vocabulary's spelling, a
  // group around it carries that spelling as its tooltip (an svg <title>).
  function tokenElement(i, kind, column) {
    const element = svg(
      "text",
      {
        class: "token " + kind,
        "data-index": i,
        x: 0,
        y: rowY(i),
        "dominant-baseline": "middle",
        "text-anchor": kind === "query" ? "end" : "start",
        tabindex: 0,
        role: "button",
        "aria-label": `token ${i}: ${spelled(i)}`,
        "aria-pressed": "false",
      },
      labels[i]
    );
    if (labels[i] === tokens[i]) {
      column.append(element);
    } else {
      const group = svg("g", { class: "spelled" });
      group.append(svg("title", {}, `token ${i}: ${JSON.stringify(tokens[i])}`), element);
      column.append(group);
    }
    return element;
  }

  function onKey(event) {
    const token = event.target.closest && event.target.closest(".token");
    if (!token) return;
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      selectQuery(Number(token.dataset.index), true);
    } else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      const step = event.key === "ArrowDown" ? 1 : -1;
      selectQuery(clamp(state.query + step, n), true);
    }
  }

  function selectQuery(i, focus) {
    const previous = queryTokens[state.query];
    previous.classList.remove("selected");
    previous.setAttribute("aria-pressed", "false");
    state.query = i;
    const current = queryTokens[i];
    current.classList.add("selected");
    current.setAttribute("aria-pressed", "true");
    if (focus) current.focus();
    render();
  }

  function drawLines() {
    const i = state.query;
    const heads = currentLayer().heads;
    const shown = state.overlay ? heads.map((_, h) => h) : [state.head];
    // The largest weight of the shown heads for this query. One head is drawn relative to
    // it; overlaid heads are all drawn on 0..1, the weight itself.
    const most = Math.max(...shown.map((h) => largest(heads[h].weights[i])));
    const scale = state.overlay ? 1 : most;
    // Overlaid heads are spread a little apart vertically so each stays visible.
    const spread = shown.length > 1 ? Math.min(3, (ROW_HEIGHT * 0.6) / (shown.length - 1)) : 0;
    const lines = [];
    shown.forEach((h, order) => {
      const offset = (order - (shown.length - 1) / 2) * spread;
      const row = heads[h].weights[i];
      for (let j = 0; j < n; j++) {
        const weight = row[j];
        if (!(weight > 0)) continue; // weight 0 (masked, or rounded to 0) draws nothing
        const relative = weight / scale;
        const style = lineStyle(relative);
        lines.push(
          svg("line", {
            class: "attention-line",
            "data-query": i,
            "data-key": j,
            "data-head": h,
            "data-weight": weight,
            "data-relative": relative,
            x1: lineStart,
            y1: rowY(i) + offset,
            x2: lineEnd,
            y2: rowY(j) + offset,
            stroke: colourOf(h),
            "stroke-width": style.width,
            "stroke-opacity": style.opacity,
          })
        );
      }
    });
    linesGroup.replaceChildren(...lines);
    markHiddenKeys(i);
    renderLineLegend(shown, most);
    view.dataset.query = String(i);
    view.dataset.layer = String(state.layer);
    view.dataset.head = String(state.head);
    view.dataset.overlay = String(state.overlay);
  }

  // Keys the mask hides from query i are greyed: no line can reach them.
  function markHiddenKeys(i) {
    const visible = currentVisible();
    let hidden = 0;
    keyTokens.forEach((element, j) => {
      const off = Boolean(visible) && !visible(i, j);
      element.classList.toggle("hidden", off);
      if (off) {
        element.setAttribute("aria-disabled", "true");
        hidden += 1;
      } else {
        element.removeAttribute("aria-disabled");
      }
    });
    const key = document.getElementById("mask-key");
    key.hidden = !visible;
    key.textContent = visible
      ? `Greyed keys are ${currentLayer().mask_label || "masked"} for the selected query: no line reaches them ` +
        `(${hidden} of ${n} for this query).`
      : "";
  }

  // The key says which scale the lines are on: the row's largest for one head, or the
  // weight itself (0..1) when the heads are overlaid.
  function renderLineLegend(shown, most) {
    const overlaid = state.overlay;
    const colour = shown.length > 1 ? "#1f2328" : colourOf(shown[0]);
    document.querySelectorAll("#line-samples .legend-line").forEach((line) => line.setAttribute("stroke", colour));
    document.querySelectorAll("#line-samples .legend-label").forEach((label, k) => {
      label.textContent = sampleLabel(LEGEND_FRACTIONS[k], overlaid);
    });
    document.querySelector("#line-legend figcaption").textContent = overlaid
      ? "Line width and darkness: the weight itself, on one scale from 0 to 1 shared by every head (1 = full)."
      : "Line width and darkness: weight relative to this row's largest (largest = full).";
    document.getElementById("line-samples").setAttribute("aria-label", overlaid
      ? "sample lines for weights 1, 0.5, 0.25 and 0.1, every head on one scale"
      : "sample lines at 100%, 50%, 25% and 10% of the row's largest weight");
    document.getElementById("line-largest").textContent = overlaid
      ? `All heads on one scale from 0 to 1: near-uniform heads draw faint lines. The largest weight of any ` +
        `head for this query is ${format(most)}.`
      : `Largest weight in this row: ${format(most)} (drawn at full width).`;
  }

  // ---- step panel ----------------------------------------------------------------

  function vector(values, column) {
    const box = html("span", { class: "vector", "data-col": column });
    values.forEach((value, k) => box.appendChild(html("span", { "data-col": column, "data-dim": String(k) }, format(value))));
    return box;
  }

  function summaryRow(list, label, content) {
    list.append(html("dt", {}, label));
    const dd = html("dd");
    if (typeof content === "string") dd.textContent = content;
    else dd.append(content);
    list.append(dd);
  }

  function stepColumns(steps, i) {
    const columns = [{ key: "score", label: steps.score_label, values: steps.scores[i] }];
    if (steps.scaled) {
      columns.push({ key: "scaled", label: "× " + format(steps.scale), values: steps.scaled[i] });
    }
    // The softmax input gets a column of its own only where a mask or a bias changed it;
    // otherwise the data leaves it out (null) to keep the page small.
    if (steps.softmax_input) {
      columns.push({ key: "softmax_input", label: "softmax input", values: steps.softmax_input[i] });
    }
    columns.push({ key: "exp", label: "exp(s − m)", values: steps.exp[i] });
    return columns;
  }

  function renderSteps() {
    const i = state.query;
    const layer = currentLayer();
    const head = currentHead();
    const steps = head.steps;
    const title = `Query at position ${i} (from 0): ${labels[i]}`;
    const where = [data.layers.length > 1 ? layer.name : null, layer.heads.length > 1 ? head.name : null]
      .filter(Boolean)
      .join(", ");
    const parts = [html("h2", {}, where ? `${title} (${where})` : title)];
    if (labels[i] !== tokens[i]) {
      parts.push(html("p", { class: "note", id: "query-token" }, `The vocabulary writes it ${JSON.stringify(tokens[i])}.`));
    }
    if (head.description) parts.push(html("p", { class: "note", id: "head-note" }, head.description));

    const visible = currentVisible();
    if (visible) {
      const masked = [];
      for (let j = 0; j < n; j++) {
        if (!visible(i, j)) masked.push(`${j}: ${labels[j]}`);
      }
      const said = layer.mask_label
        ? `Keys ${layer.mask_label} for this query (they get no weight): `
        : "Masked keys (the mask stops this query from attending to them): ";
      parts.push(
        html(
          "p",
          { class: "note", id: "mask-note" },
          masked.length ? `${said}${masked.join(", ")}.` : "No key is masked for this query."
        )
      );
    }

    // A long input's page may hold the n x n step rows only for a window of queries.
    const rowHere = Boolean(steps) && steps.scores[i] !== null;
    const columns = rowHere ? stepColumns(steps, i) : [];
    if (!steps) {
      parts.push(
        html(
          "p",
          { class: "note", id: "steps-left-out" },
          data.steps_note ||
            "The detailed numbers of this head were left out to keep the page small; only its weights are shown."
        )
      );
    } else if (!rowHere) {
      const [start, end] = steps.rows;
      parts.push(
        html(
          "p",
          { class: "note", id: "steps-row-left-out" },
          `The scores of query ${i} were left out to keep the page small: this page holds them for queries ` +
            `${start} to ${end - 1}. selfattn view --query ${i} makes a page that holds them.`
        )
      );
    }
    columns.push({ key: "weight", label: "weight", values: head.weights[i] });
    if (data.flash && data.flash.weights_from_lse[i] !== null) {
      columns.push({ key: "from_lse", label: "exp(s − lse)", values: data.flash.weights_from_lse[i] });
    }

    const table = html("table", { id: "step-table" });
    const headRow = html("tr");
    headRow.append(html("th", { scope: "col" }, "token"));
    columns.forEach((column) => headRow.append(html("th", { scope: "col", "data-col": column.key }, column.label)));
    table.append(html("thead"));
    table.tHead.append(headRow);
    const body = html("tbody");
    for (let j = 0; j < n; j++) {
      const row = html("tr", { "data-key": String(j) });
      if (visible && !visible(i, j)) row.classList.add("masked");
      if (j === i) row.classList.add("self");
      row.append(html("th", { scope: "row", title: `token ${j}: ${JSON.stringify(tokens[j])}` }, labels[j]));
      columns.forEach((column) => row.append(html("td", { "data-col": column.key }, format(column.values[j]))));
      body.append(row);
    }
    table.append(body);
    const scroll = html("div", { id: "step-table-scroll", class: "scroll" });
    scroll.append(table);
    parts.push(scroll);

    const summary = html("dl", { id: "step-summary" });
    if (steps) {
      const max = html("span", { "data-col": "max" }, format(steps.max[i]));
      const sum = html("span", { "data-col": "exp_sum" }, format(steps.exp_sum[i]));
      summaryRow(summary, "m (max)", max);
      summaryRow(summary, "sum of exp", sum);
      summaryRow(summary, `context (${head.name || "this head"})`, vector(steps.context[i], "context"));
    }
    // A model's layer carries its own output (the hidden state leaving it); wide vectors
    // arrive cut to their first numbers, and the label says so.
    const outputs = layer.output || data.output;
    if (outputs) {
      const shown = outputs[i].length;
      const cut = data.vector_width > shown ? ` (first ${shown} of ${data.vector_width})` : "";
      const label = layer.output ? `${labels[i]} after ${layer.name}` : `output of ${labels[i]}`;
      summaryRow(summary, label + cut, vector(outputs[i], "output"));
    }
    parts.push(summary);
    if (data.flash) parts.push(flashSection(data.flash, i));
    panel.replaceChildren(...parts);
  }

  // The flash variant: the running numbers of query i after each key block, as the data
  // gives them (the online softmax ran in Python; nothing is recomputed here).
  function flashSection(flash, i) {
    const section = html("section", { id: "flash-steps" });
    section.append(html("h3", {}, `Online softmax, keys in blocks of ${flash.block_size}`));
    section.append(
      html("p", { class: "note" }, "The running max m, sum l and acc after each block; r = exp(m before − m after) rescales what was summed before.")
    );
    if (!flash.blocks) {
      section.append(
        html(
          "p",
          { class: "note", id: "flash-left-out" },
          "The block-by-block numbers were left out to keep the page small; " +
            "selfattn explain --variant flash --query TOKEN prints them for one query."
        )
      );
    } else {
      const shown = flash.blocks.length ? flash.blocks[0].acc[i].length : 0;
      const cut = flash.acc_width > shown ? ` (first ${shown} of ${flash.acc_width})` : "";
      const table = html("table", { id: "flash-table" });
      const headRow = html("tr");
      ["block", "keys", "block max", "m", "r", "l", "acc" + cut].forEach((label) =>
        headRow.append(html("th", { scope: "col" }, label))
      );
      table.append(html("thead"));
      table.tHead.append(headRow);
      const body = html("tbody");
      flash.blocks.forEach((block, b) => {
        const row = html("tr", { "data-block": String(b) });
        row.append(html("th", { scope: "row" }, String(b + 1)));
        row.append(html("td", { "data-col": "flash_keys" }, labels.slice(block.start, block.end).join(", ")));
        for (const [key, values] of [["flash_block_max", block.block_max], ["flash_m", block.m], ["flash_r", block.rescale], ["flash_l", block.l]]) {
          row.append(html("td", { "data-col": key }, format(values[i])));
        }
        const acc = html("td");
        acc.append(vector(block.acc[i], "flash_acc"));
        row.append(acc);
        body.append(row);
      });
      table.append(body);
      const scroll = html("div", { id: "flash-table-scroll", class: "scroll" });
      scroll.append(table);
      section.append(scroll);
    }
    const summary = html("dl", { id: "flash-summary" });
    summaryRow(summary, "acc / l (flash)", vector(flash.output[i], "flash_output"));
    summaryRow(summary, "plain softmax", vector(flash.plain_output[i], "flash_plain_output"));
    summaryRow(summary, "lse = m + log l", html("span", { "data-col": "flash_lse" }, format(flash.lse[i])));
    section.append(summary);
    return section;
  }

  function render() {
    renderLegend();
    drawLines();
    renderSteps();
  }

  buildHeader();
  buildControls();
  buildLineLegend();
  buildHeadView();
  selectQuery(state.query, false);
})();
