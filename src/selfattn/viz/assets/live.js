// The live app's page script (selfattn serve). It asks its own server for every number
// (the JSON API in selfattn/serve/app.py) and computes no attention itself: it only lays the
// numbers out, colours them and prints them with toFixed(4) (toExponential from 1e10 up, or
// below 1e-10 when not 0), as `selfattn explain` prints them.
// Data reaches the page as text only (textContent, attributes), never as markup; styles are
// set through classes or the CSSOM, which the page's Content-Security-Policy allows.
"use strict";

(function () {
  const PRECISION = 4;
  const SCIENTIFIC_FROM = 1e10; // as selfattn.formatting.SCIENTIFIC_FROM and SCIENTIFIC_BELOW
  const SCIENTIFIC_BELOW = 1e-10;
  // A model's grid: up to this many tokens every cell is an element; past it the whole matrix
  // is drawn on a canvas and only a window of cells is built (n x n elements would freeze the page).
  const FULL_GRID_MAX = 48;
  const FULL_GRID_MAX_CELLS = 8000; // every head of a layer at once: at most this many cells in all
  const WINDOW = { rows: 32, cols: 48 };
  const WINDOW_ALL = { rows: 16, cols: 16 };
  const DARKEST = [11, 77, 158]; // the colour of weight 1; weight 0 is white
  const PALETTE = [
    "#0969da", "#d1242f", "#1a7f37", "#8250df", "#bc4c00", "#0598bc", "#bf3989", "#6e7781",
    "#9a6700", "#4d2d8c", "#116329", "#a40e26", "#0550ae", "#953800", "#57606a", "#ff8182",
  ];
  // The arrows: a line's width and opacity grow with its weight (relative to the row's largest
  // for one head; the weight itself when every head is overlaid), as in the explorer.
  const MIN_WIDTH = 0.5;
  const MAX_WIDTH = 7;
  const MIN_OPACITY = 0.15;
  const ARROW_ROW = 18;
  const ARROW_TOP = 26;
  const ARROW_GAP = 170;

  const $ = (id) => document.getElementById(id);
  const SVG_NS = $("arrows").namespaceURI; // the namespace of the page's own <svg>: no URL written here

  // ---- small helpers ---------------------------------------------------------------

  function format(value) {
    // "-inf", "inf" and "nan" arrive as strings (JSON has no such numbers).
    if (typeof value !== "number") return String(value);
    const size = Math.abs(value);
    if (size >= SCIENTIFIC_FROM || (size > 0 && size < SCIENTIFIC_BELOW)) return value.toExponential(PRECISION);
    const text = value.toFixed(PRECISION);
    return /^-[0.]*$/.test(text) ? text.slice(1) : text; // no "-0.0000", as explain writes it
  }

  function el(tag, attributes, text) {
    const element = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (value !== null && value !== undefined) element.setAttribute(name, String(value));
    }
    if (text !== undefined && text !== null) element.textContent = String(text);
    return element;
  }

  function svg(tag, attributes, text) {
    const element = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attributes || {})) element.setAttribute(name, String(value));
    if (text !== undefined) element.textContent = text;
    return element;
  }

  function clamp(value, low, high) {
    return Math.min(Math.max(value, low), high);
  }

  // How dark a weight is drawn: the square root, so that weights of 0.01 still show.
  function shade(weight) {
    return typeof weight === "number" && weight > 0 ? Math.sqrt(Math.min(1, weight)) : 0;
  }

  function colourRGB(weight) {
    const t = shade(weight);
    return DARKEST.map((c) => Math.round(255 + (c - 255) * t));
  }

  function colour(weight) {
    const [r, g, b] = colourRGB(weight);
    return `rgb(${r}, ${g}, ${b})`;
  }

  function quoted(token) {
    return JSON.stringify(String(token));
  }

  // [4, 5] -> "4–5"; [1, 3] -> "1, 3"
  function spanText(list) {
    if (list.length === 1) return String(list[0]);
    const contiguous = list.every((value, k) => k === 0 || value === list[k - 1] + 1);
    return contiguous ? `${list[0]}–${list[list.length - 1]}` : list.join(", ");
  }

  function devicePixels() {
    return Math.min(2, window.devicePixelRatio || 1);
  }

  // ---- requests, busy state and the message line -----------------------------------

  class ApiError extends Error {}

  let pending = 0;
  const busy = { walk: 0, attention: 0, generate: 0, models: 0 };
  const SECTION_NAMES = {
    walk: "The seed's walkthrough",
    attention: "A model's attention",
    generate: "Generation",
    models: "Models",
  };
  let messageFrom = null;

  function setBusy(section, delta) {
    pending = Math.max(0, pending + delta);
    busy[section] = Math.max(0, busy[section] + delta);
    document.body.dataset.pending = String(pending);
    $("status").textContent = pending ? "working…" : "";
    refreshButtons();
  }

  function showError(section, text) {
    const box = $("message");
    box.textContent = `${SECTION_NAMES[section]}: ${text}`;
    box.dataset.section = section;
    box.hidden = false;
    messageFrom = section;
  }

  function clearError(section) {
    if (messageFrom !== section) return;
    const box = $("message");
    box.hidden = true;
    box.textContent = "";
    delete box.dataset.section;
    messageFrom = null;
  }

  function errorOf(text, status) {
    try {
      const data = JSON.parse(text);
      if (data && (data.error || data.detail)) return new ApiError(String(data.error || data.detail));
    } catch (_) {
      // not JSON: fall through to the text itself
    }
    return new ApiError(`the server answered ${status}: ${String(text).slice(0, 300)}`);
  }

  async function reach(path, options) {
    try {
      return await fetch(path, options);
    } catch (error) {
      if (error && error.name === "AbortError") throw error;
      throw new ApiError("the server did not answer (is selfattn serve still running?)");
    }
  }

  async function api(path, body, signal) {
    const options = body === undefined
      ? { signal }
      : { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal };
    const response = await reach(path, options);
    const text = await response.text();
    if (!response.ok) throw errorOf(text, response.status);
    try {
      return JSON.parse(text);
    } catch (_) {
      throw new ApiError("the server's answer is not JSON");
    }
  }

  // Run ``work`` as one request of ``section``: its buttons wait, "working…" shows, and a
  // failure becomes the message line (unless a newer request made this one stale).
  async function task(section, work, current) {
    const stillCurrent = current || (() => true);
    setBusy(section, +1);
    try {
      await work();
    } catch (error) {
      if (error && error.name === "AbortError") return;
      if (!stillCurrent()) return;
      const text = error instanceof ApiError ? error.message : `the page failed: ${error && error.message}`;
      showError(section, text);
    } finally {
      setBusy(section, -1);
    }
  }

  // A function that runs ``fn`` once, ``ms`` after the last call; the wait counts as busy,
  // so "working…" (and data-pending) already show while the page waits to send.
  function debounced(section, fn, ms) {
    let timer = null;
    return function () {
      if (timer !== null) clearTimeout(timer);
      else setBusy(section, +1);
      timer = setTimeout(() => {
        timer = null;
        setBusy(section, -1);
        fn();
      }, ms);
    };
  }

  function refreshButtons() {
    const model = currentModel();
    const decoder = Boolean(model && model.kind === "decoder");
    const generating = busy.generate > 0;
    $("run").disabled = busy.attention > 0 || !model;
    $("open-explorer").disabled = !att.data;
    for (const id of ["generate-step", "generate-run"]) $(id).disabled = generating || !decoder;
    $("generate-reset").disabled = !decoder;
    $("ablate-clear").disabled = generating || !decoder;
    document.querySelectorAll("#ablate-heads input").forEach((box) => {
      box.disabled = generating || !decoder;
    });
  }

  // ---- tabs --------------------------------------------------------------------------

  const TABS = Array.from(document.querySelectorAll("#tabs [role=tab]"));

  function showTab(name) {
    for (const tab of TABS) {
      const selected = tab.dataset.tab === name;
      tab.setAttribute("aria-selected", String(selected));
      tab.tabIndex = selected ? 0 : -1;
      $(tab.getAttribute("aria-controls")).hidden = !selected;
    }
    $("model-bar").hidden = name === "walk";
    if (name === "generate") renderGeneration();
  }

  function setUpTabs() {
    TABS.forEach((tab, k) => {
      tab.addEventListener("click", () => showTab(tab.dataset.tab));
      tab.addEventListener("keydown", (event) => {
        if (event.key !== "ArrowRight" && event.key !== "ArrowLeft") return;
        const next = TABS[(k + (event.key === "ArrowRight" ? 1 : TABS.length - 1)) % TABS.length];
        next.focus();
        showTab(next.dataset.tab);
      });
    });
    showTab("walk");
  }

  // ---- the models --------------------------------------------------------------------

  const models = { list: [], byName: new Map() };

  function currentModel() {
    return models.byName.get($("model-select").value) || null;
  }

  function loadModels() {
    return task("models", async () => {
      const data = await api("/api/models");
      models.list = data.models || [];
      models.byName = new Map(models.list.filter((m) => !m.error).map((m) => [m.name, m]));
      const select = $("model-select");
      select.replaceChildren(
        ...models.list.map((m) => {
          if (m.error) return el("option", { value: m.name, disabled: "" }, `${m.name}: unavailable (${m.error})`);
          const shape = `${m.layers} layers × ${m.heads} heads`;
          return el("option", { value: m.name }, `${m.name} (${m.kind}, ${shape})`);
        })
      );
      const usable = models.list.filter((m) => !m.error);
      const preferred = usable.find((m) => m.name === "stories260K") || usable[0];
      if (preferred) select.value = preferred.name;
      clearError("models");
      onModelChange();
    });
  }

  function onModelChange() {
    const model = currentModel();
    renderModelFacts(model);
    fillLayerHead(model);
    resetAttention();
    resetGeneration();
    buildAblationGrid(model);
    refreshButtons();
  }

  function renderModelFacts(model) {
    const facts = $("model-facts");
    if (!model) {
      facts.textContent = "no model available";
    } else {
      const parts = [`${model.kind}: ${model.layers} layers × ${model.heads} heads`];
      if (model.kv_heads < model.heads) parts.push(`${model.kv_heads} key/value heads (grouped-query attention)`);
      parts.push(`${model.positions} positions`);
      facts.textContent = parts.join(", ") + (model.loaded ? "" : " · loads when first used");
    }
  }

  function fillOptions(select, entries, keep) {
    select.replaceChildren(...entries.map(([value, label]) => el("option", { value }, label)));
    if (entries.some(([value]) => value === keep)) select.value = keep;
  }

  function fillLayerHead(model) {
    const layers = model ? model.layers : 0;
    const heads = model ? model.heads : 0;
    const layerEntries = Array.from({ length: layers }, (_, l) => [String(l), `layer ${l}`]);
    const headEntries = Array.from({ length: heads }, (_, h) => [String(h), `head ${h}`]);
    fillOptions($("layer-select"), layerEntries, $("layer-select").value);
    fillOptions($("head-select"), [...headEntries, ["all", "all heads"]], $("head-select").value);
    fillOptions($("cache-layer"), layerEntries, $("cache-layer").value);
    fillOptions($("cache-head"), headEntries, $("cache-head").value);
  }

  // ---- 1. the seed's walkthrough -----------------------------------------------------

  const walk = { seq: 0, query: null, data: null };

  const VARIANT_NOTES = {
    simple: "simple: scores are plain dot products of the word vectors, the vectors themselves are mixed.",
    scaled: "scaled: the same, with every score divided by √d_k so that longer vectors do not give bigger scores.",
    qkv: "qkv: each vector is first multiplied by three matrices (untrained, seeded): W_q for the query, W_k for the keys, W_v for the values.",
    causal: "causal: qkv with a mask, so that each word reads only itself and the words before it (as a text generator does).",
    multihead: "multihead: several heads, each with its own W_q, W_k, W_v, work side by side; W_o mixes their outputs.",
    gqa: "gqa: grouped-query attention: several query heads share one key/value head.",
    flash: "flash: the same weights, computed block by block with the online softmax; the numbers do not change.",
  };

  function walkBody(query) {
    const body = {
      text: $("walk-sentence").value,
      variant: $("walk-variant").value,
      positional: $("walk-positional").value,
      precision: PRECISION,
    };
    if (query !== null && query !== undefined) body.query = query;
    return body;
  }

  function walkRequest(query) {
    const body = walkBody(query);
    const seq = ++walk.seq;
    const current = () => seq === walk.seq;
    return task("walk", async () => {
      const data = await api("/api/explain", body);
      if (!current()) return;
      clearError("walk");
      walk.data = data;
      walk.query = data.query.index;
      renderWalk(data);
    }, current);
  }

  // The query to keep when the sentence changes: the same position while the sentence is that long.
  function keptQuery() {
    const words = $("walk-sentence").value.trim().split(/\s+/).filter(Boolean).length;
    return walk.query !== null && walk.query < words ? walk.query : null;
  }

  function perHead(value, h, multi) {
    return multi ? value[h] : value;
  }

  function renderWalk(data) {
    const q = data.query;
    const multi = Array.isArray(q.weights[0]);
    const heads = multi ? q.weights.length : 1;
    $("walk-variant-note").textContent = VARIANT_NOTES[data.variant] || "";

    // Tokens
    $("walk-tokens").replaceChildren(
      ...data.tokens.map((token, i) => {
        const button = el("button", {
          type: "button",
          "data-index": i,
          "aria-pressed": String(i === q.index),
          title: `token ${i} (x^(${i + 1}) in the maths)`,
        }, token);
        button.append(el("span", { class: "position" }, i));
        return button;
      })
    );

    // Embeddings
    const source = data.embedding_source || {};
    const d = data.embeddings.length ? data.embeddings[0].length : 0;
    const embedNote = [`Each token becomes one row of X: ${d} numbers. Here they come from ${source.description || "the embedding table"}.`];
    if (source.note) embedNote.push(source.note.charAt(0).toUpperCase() + source.note.slice(1) + ".");
    if (source.trained === false) embedNote.push("None of them was learned, so any pattern below is arithmetic, not meaning.");
    const positional = data.positional && data.positional.name;
    if (positional === "sinusoidal" || positional === "learned") {
      embedNote.push(`With ${positional} positions a vector for each position is added to these rows before the scores.`);
    }
    $("walk-embed-note").textContent = embedNote.join(" ");
    $("walk-embeddings").replaceChildren(
      numberTable(
        ["token", ...Array.from({ length: d }, (_, k) => `x${k + 1}`)],
        data.tokens.map((token, i) => ({
          label: token,
          values: data.embeddings[i],
          query: i === q.index,
          attributes: { "data-row": i },
        })),
        "embedding"
      )
    );

    // Scores, exp, weights: one table per head
    const projected = Boolean(data.projections);
    const scaled = Boolean(data.scaling);
    $("walk-score-note").textContent = scoreSentence(data, projected, scaled, positional);
    $("walk-exp-note").textContent = q.max !== undefined
      ? "exp(s − m): e to the power of each score, after subtracting the largest score m. Subtracting m changes " +
        "no weight, but keeps exp from overflowing. Masked scores (−inf) give exp 0."
      : "exp(ω): e to the power of each score. It is always positive, and a score a little higher than the " +
        "rest gets a clearly larger exp.";
    const kvOf = data.multihead ? data.multihead.kv_head_of : null;
    const boxes = [];
    for (let h = 0; h < heads; h++) {
      const box = el("div", { class: "head-box", "data-head": h });
      if (multi) {
        const title = kvOf && data.multihead.n_kv_heads < data.multihead.n_heads
          ? `head ${h} (reads key/value head ${kvOf[h]})`
          : `head ${h}`;
        box.append(el("h4", {}, title));
      }
      const columns = [];
      const unscaled = q.scores_unscaled !== undefined ? perHead(q.scores_unscaled, h, multi) : null;
      const scores = perHead(q.scores, h, multi);
      const differs = unscaled && unscaled.some((value, j) => value !== scores[j]);
      if (differs) columns.push({ key: "qk", label: projected ? "q · k" : "x · x", values: unscaled });
      columns.push({ key: "score", label: q.max !== undefined ? "score s" : "score ω", values: scores });
      columns.push({ key: "exp", label: q.max !== undefined ? "exp(s − m)" : "exp(ω)", values: perHead(q.exp, h, multi) });
      columns.push({ key: "weight", label: "weight", values: perHead(q.weights, h, multi) });
      const table = el("table", { "data-head": h });
      const headRow = el("tr");
      headRow.append(el("th", { scope: "col" }, "key"));
      columns.forEach((c) => headRow.append(el("th", { scope: "col", "data-col": c.key }, c.label)));
      table.append(el("thead"));
      table.tHead.append(headRow);
      const body = el("tbody");
      data.tokens.forEach((token, j) => {
        const row = el("tr", { "data-key": j });
        if (j === q.index) row.classList.add("query");
        if (typeof scores[j] !== "number") row.classList.add("masked");
        row.append(el("th", { scope: "row", title: `token ${j}` }, j === q.index ? `${token} ← query` : token));
        columns.forEach((c) => row.append(el("td", { "data-col": c.key, "data-key": j, "data-head": h }, format(c.values[j]))));
        body.append(row);
      });
      table.append(body);
      box.append(table);
      const sums = el("p", { class: "sums" });
      if (q.max !== undefined) {
        sums.append("m (largest score) = ", el("span", { "data-col": "max", "data-head": h }, format(perHead(q.max, h, multi))), " · ");
      }
      sums.append("sum of exp = ", el("span", { "data-col": "exp_sum", "data-head": h }, format(perHead(q.exp_sum, h, multi))));
      box.append(sums);
      boxes.push(box);
    }
    $("walk-heads").replaceChildren(...boxes);

    // The context vector
    const context = $("walk-context");
    const lines = [];
    if (multi) {
      q.head_context.forEach((vector, h) => lines.push(contextLine(`head ${h}`, vector, "head_context", h)));
      lines.push(contextLine("combined (the heads side by side, times W_o)", q.context, "context", null));
      $("walk-context-note").textContent =
        "Each head mixes its own value vectors with its own weights. The heads' results are put side by side and " +
        "multiplied by W_o: that is the query's new vector.";
    } else {
      lines.push(contextLine(`new vector of ${quoted(q.token)}`, q.context, "context", null));
      $("walk-context-note").textContent = projected
        ? "The query's new vector: each token's value vector (x · W_v) times its weight, all added up. Tokens with " +
          "big weights pull it towards themselves."
        : "The query's new vector: each token's row of X times its weight, all added up. Tokens with big weights " +
          "pull it towards themselves.";
    }
    context.replaceChildren(...lines);
  }

  function scoreSentence(data, projected, scaled, positional) {
    const parts = [];
    if (projected) {
      parts.push("Score = q · k: the query's vector times W_q, dotted with each key's vector times W_k (multiply " +
        "component by component, add up). Vectors that point the same way score high.");
    } else {
      parts.push("Score ω = the dot product of the query's row of X with each token's row: multiply component by " +
        "component and add up. Vectors that point the same way score high.");
    }
    if (scaled && data.scaling) parts.push(`Then divided by √d_k = ${format(data.scaling.sqrt_d_k)}.`);
    if (data.mask) parts.push("Later tokens are masked: their score is −inf, so they get no weight.");
    if (positional === "rope") parts.push("RoPE turns q and k by an angle that grows with the position, so the score also depends on the distance.");
    if (positional === "alibi") parts.push("ALiBi subtracts a penalty that grows with the distance between the two tokens.");
    return parts.join(" ");
  }

  function contextLine(label, vector, column, head) {
    const line = el("p", { class: "context-line" });
    line.append(el("span", { class: "label" }, label));
    const box = el("span", { class: "vector", "data-col": column, "data-head": head });
    vector.forEach((value, k) => box.append(el("span", { "data-dim": k }, format(value))));
    line.append(box);
    return line;
  }

  function numberTable(headers, rows, column) {
    const table = el("table");
    const headRow = el("tr");
    headers.forEach((text) => headRow.append(el("th", { scope: "col" }, text)));
    table.append(el("thead"));
    table.tHead.append(headRow);
    const body = el("tbody");
    for (const row of rows) {
      const tr = el("tr", row.attributes);
      if (row.query) tr.classList.add("query");
      tr.append(el("th", { scope: "row" }, row.label));
      row.values.forEach((value, k) => tr.append(el("td", { "data-col": column, "data-dim": k }, format(value))));
      body.append(tr);
    }
    table.append(body);
    return table;
  }

  function setUpWalk() {
    $("walk-tokens").addEventListener("click", (event) => {
      const button = event.target.closest("button[data-index]");
      if (button) walkRequest(Number(button.dataset.index));
    });
    const again = debounced("walk", () => walkRequest(keptQuery()), 350);
    $("walk-sentence").addEventListener("input", again);
    $("walk-variant").addEventListener("change", () => walkRequest(walk.query));
    $("walk-positional").addEventListener("change", () => walkRequest(walk.query));
    $("walk-explorer").addEventListener("click", () => {
      const fields = walkBody(walk.query);
      const params = new URLSearchParams({ text: fields.text, variant: fields.variant, positional: fields.positional });
      if (fields.query !== undefined) params.set("query", String(fields.query));
      $("walk-frame").src = "/explorer?" + params.toString();
      $("walk-frame-box").hidden = false;
      $("walk-frame-box").scrollIntoView({ block: "nearest" });
    });
    $("walk-frame-close").addEventListener("click", () => {
      $("walk-frame-box").hidden = true;
      $("walk-frame").removeAttribute("src");
    });
  }

  // ---- 2. a model's attention --------------------------------------------------------

  const att = { seq: 0, data: null, request: null, query: 0, r0: 0, c0: 0, layout: null };

  function resetAttention() {
    att.seq += 1; // a request still on its way is now stale
    att.data = null;
    att.request = null;
    $("attention-result").hidden = true;
    $("attention-facts").replaceChildren();
    $("attention-grid").replaceChildren();
    $("explorer-box").hidden = true;
    $("explorer-frame").removeAttribute("src");
  }

  function runAttention() {
    const model = currentModel();
    if (!model) return Promise.resolve();
    const headValue = $("head-select").value;
    const body = {
      model: model.name,
      text: $("text-input").value,
      layer: Number($("layer-select").value),
      head: headValue === "all" ? "all" : Number(headValue),
    };
    const seq = ++att.seq;
    const current = () => seq === att.seq;
    return task("attention", async () => {
      const data = await api("/api/attention", body);
      if (!current()) return;
      clearError("attention");
      const n = data.tokens.length;
      const sameText = att.request && att.request.text === body.text && att.request.model === body.model;
      att.data = data;
      att.request = body;
      if (!sameText || att.query >= n) att.query = data.causal ? n - 1 : Math.min(1, n - 1);
      model.loaded = true;
      renderModelFacts(currentModel());
      centreWindow(att.query, null);
      renderAttention();
    }, current);
  }

  // Every head shown: [{head, weights (n x n)}].
  function shownHeads(data) {
    if (data.head === "all") return data.weights.map((weights, head) => ({ head, weights }));
    return [{ head: data.head, weights: data.weights }];
  }

  function layoutOf(data) {
    const n = data.tokens.length;
    const all = data.head === "all";
    const heads = all ? data.weights.length : 1;
    const full = n <= FULL_GRID_MAX && heads * n * n <= FULL_GRID_MAX_CELLS;
    const win = all ? WINDOW_ALL : WINDOW;
    return { n, all, full, rows: full ? n : Math.min(n, win.rows), cols: full ? n : Math.min(n, win.cols) };
  }

  function visibleFn(data) {
    const ranges = data.mask_ranges;
    return (i, j) => !ranges || (j >= ranges[i][0] && j < ranges[i][1]);
  }

  function centreWindow(row, col) {
    if (!att.data) return;
    const layout = layoutOf(att.data);
    const { n, rows, cols } = layout;
    att.r0 = clamp(row - Math.floor(rows / 2), 0, n - rows);
    if (col === null) {
      // A causal row has its weights at and before the diagonal: put the query's column near the right.
      const anchor = att.data.causal ? row - cols + Math.ceil(cols / 6) : row - Math.floor(cols / 2);
      att.c0 = clamp(anchor, 0, n - cols);
    } else {
      att.c0 = clamp(col - Math.floor(cols / 2), 0, n - cols);
    }
  }

  function moveWindow(rowSteps, colSteps) {
    if (!att.data) return;
    const { n, rows, cols } = layoutOf(att.data);
    att.r0 = clamp(att.r0 + rowSteps * Math.max(1, Math.floor(rows / 2)), 0, n - rows);
    att.c0 = clamp(att.c0 + colSteps * Math.max(1, Math.floor(cols / 2)), 0, n - cols);
    renderGrid(att.data);
  }

  function renderAttention() {
    const data = att.data;
    $("attention-result").hidden = false;
    renderFacts(data);
    renderGrid(data);
    renderArrows(data, true);
    refreshButtons();
  }

  function renderFacts(data) {
    const n = data.tokens.length;
    const items = [];
    const which = data.head === "all" ? "every head" : `head ${data.head}`;
    items.push(`${data.model}: ${n} tokens, layer ${data.layer}, ${which}. Rows are queries, columns are keys; each row adds up to 1.`);
    if (data.causal) {
      items.push(data.window
        ? `Causal mask with a sliding window of ${data.window}: each query reads itself and at most the ${data.window - 1} tokens before it; the rest is masked (hatched).`
        : "Causal mask: each query reads only itself and the tokens before it. The later keys are masked (hatched), so the weights fill a lower triangle.");
    } else {
      items.push("No mask: this is an encoder, so every token reads every token, before and after it.");
    }
    if (data.positional === "rope") {
      items.push(`Positions by RoPE (base ${data.rope_base}): q and k are turned by angles that grow with the position, so a score depends on how far apart the two tokens are.`);
    } else if (data.positional === "learned") {
      items.push("Learned positions: a trained vector for each position is added to the token's embedding before the first layer.");
    } else if (data.positional) {
      items.push(`Positions: ${data.positional}.`);
    }
    const kvOf = data.kv_head_of || [];
    const heads = kvOf.length;
    if (data.kv_heads && data.kv_heads < heads) {
      items.push(`Grouped-query attention: ${heads} query heads share ${data.kv_heads} key/value heads, ${heads / data.kv_heads} query heads to each.`);
      if (data.head === "all") {
        const groups = [];
        for (let kv = 0; kv < data.kv_heads; kv++) {
          groups.push(`key/value head ${kv}: heads ${spanText(kvOf.map((k, h) => (k === kv ? h : -1)).filter((h) => h >= 0))}`);
        }
        items.push(groups.join("; ") + ".");
      } else {
        items.push(gqaSentence(kvOf, data.head));
      }
    } else if (heads) {
      items.push("Every head has its own keys and values.");
    }
    $("attention-facts").replaceChildren(...items.map((text) => el("li", {}, text)));
  }

  function gqaSentence(kvOf, head) {
    const kv = kvOf[head];
    const sharing = kvOf.map((k, h) => (k === kv ? h : -1)).filter((h) => h >= 0);
    return `Head ${head} reads key/value head ${kv}, shared with heads ${spanText(sharing)}.`;
  }

  function cellTitle(data, i, j, weight, visible) {
    const labels = data.labels;
    const said = `query ${i} ${labels[i]} → key ${j} ${labels[j]}: ${format(weight)}`;
    return visible ? said : `${said} (masked: query ${i} may not read key ${j})`;
  }

  function renderGrid(data) {
    const layout = layoutOf(data);
    att.layout = layout;
    const { n, all, full, rows, cols } = layout;
    att.r0 = clamp(att.r0, 0, n - rows);
    att.c0 = clamp(att.c0, 0, n - cols);
    const rowRange = full ? [0, n] : [att.r0, att.r0 + rows];
    const colRange = full ? [0, n] : [att.c0, att.c0 + cols];
    const heads = shownHeads(data);
    const cell = all
      ? clamp(Math.floor((full ? 150 : 150) / cols), 5, 14)
      : clamp(Math.floor((full ? 560 : 640) / cols), 10, 24);
    const grid = $("attention-grid");
    grid.dataset.n = String(n);
    grid.dataset.mode = full ? "full" : "window";
    grid.dataset.rows = `${rowRange[0]}-${rowRange[1]}`;
    grid.dataset.cols = `${colRange[0]}-${colRange[1]}`;
    grid.replaceChildren(...heads.map(({ head, weights }) => headGrid(data, head, weights, rowRange, colRange, all, cell)));
    $("overview-box").hidden = full;
    if (!full) {
      renderOverviews(data, heads, all);
      $("window-note").textContent =
        `${n} tokens: the canvas shows every weight; the cells below are queries ${rowRange[0]}–${rowRange[1] - 1} ` +
        `× keys ${colRange[0]}–${colRange[1] - 1}. Click the canvas or use the arrows to move them.`;
    }
  }

  function headGrid(data, head, weights, rowRange, colRange, small, cell) {
    const visible = visibleFn(data);
    const labels = data.labels;
    const box = el("div", { class: "head-grid", "data-head": head });
    if (small) {
      const title = el("h4");
      const swatch = el("span", { class: "swatch-dot", "aria-hidden": "true" }, "■ ");
      swatch.style.color = PALETTE[head % PALETTE.length];
      title.append(swatch, `head ${head}`);
      if (data.kv_heads < data.kv_head_of.length) title.append(el("span", { class: "kv" }, ` · kv ${data.kv_head_of[head]}`));
      box.append(title);
    }
    const matrix = el("div", { class: small ? "matrix small" : "matrix", role: "grid", "data-head": head });
    const labelWidth = small ? 0 : 86;
    const count = colRange[1] - colRange[0];
    matrix.style.gridTemplateColumns = (labelWidth ? `${labelWidth}px ` : "") + `repeat(${count}, ${cell}px)`;
    matrix.style.gridAutoRows = `${cell}px`;
    if (!small) {
      matrix.append(el("div", { class: "corner" }, "query ↓ key →"));
      for (let j = colRange[0]; j < colRange[1]; j++) {
        const label = el("div", { class: "col-label", "data-col": j, title: `key ${j}: ${quoted(data.tokens[j])}` }, labels[j]);
        if (j === att.query) label.classList.add("query-col");
        matrix.append(label);
      }
      matrix.style.gridTemplateRows = "auto";
    }
    for (let i = rowRange[0]; i < rowRange[1]; i++) {
      if (!small) {
        const label = el("div", { class: "row-label", "data-row": i, title: `query ${i}: ${quoted(data.tokens[i])}` }, labels[i]);
        if (i === att.query) label.classList.add("query-row");
        matrix.append(label);
      }
      const row = weights[i];
      for (let j = colRange[0]; j < colRange[1]; j++) {
        const weight = row[j];
        const seen = visible(i, j);
        const c = el("div", {
          class: "cell",
          role: "gridcell",
          "data-row": i,
          "data-col": j,
          "data-head": head,
          "data-weight": String(weight),
          title: cellTitle(data, i, j, weight, seen),
        });
        if (seen) c.style.background = colour(weight);
        else {
          c.classList.add("masked");
          c.dataset.masked = "true";
        }
        if (i === att.query) c.classList.add("in-query");
        matrix.append(c);
      }
    }
    box.append(matrix);
    return box;
  }

  // The overview: every weight of a head as one pixel, on a canvas; the window of cells is
  // the outlined rectangle.
  function renderOverviews(data, heads, all) {
    const n = data.tokens.length;
    const size = all ? 150 : 260;
    const visible = visibleFn(data);
    const scale = devicePixels();
    const boxes = heads.map(({ head, weights }) => {
      const off = document.createElement("canvas");
      off.width = n;
      off.height = n;
      const offContext = off.getContext("2d");
      const image = offContext.createImageData(n, n);
      const pixels = image.data;
      for (let i = 0; i < n; i++) {
        const row = weights[i];
        for (let j = 0; j < n; j++) {
          const at = (i * n + j) * 4;
          if (visible(i, j)) {
            const [r, g, b] = colourRGB(row[j]);
            pixels[at] = r;
            pixels[at + 1] = g;
            pixels[at + 2] = b;
          } else {
            pixels[at] = 222; // masked: grey
            pixels[at + 1] = 226;
            pixels[at + 2] = 231;
          }
          pixels[at + 3] = 255;
        }
      }
      offContext.putImageData(image, 0, 0);
      const canvas = el("canvas", {
        "data-testid": "overview",
        "data-head": head,
        width: Math.round(size * scale),
        height: Math.round(size * scale),
        tabindex: 0,
        title: "every weight of this head; click to move the cells there",
        "aria-label": `overview of head ${head}: click a point to show its cells`,
      });
      canvas.style.width = `${size}px`;
      canvas.style.height = `${size}px`;
      const context = canvas.getContext("2d");
      context.imageSmoothingEnabled = false;
      context.drawImage(off, 0, 0, canvas.width, canvas.height);
      const px = canvas.width / n;
      context.strokeStyle = "#bc4c00";
      context.lineWidth = 2 * scale;
      context.strokeRect(att.c0 * px, att.r0 * px, layoutOf(data).cols * px, layoutOf(data).rows * px);
      context.fillStyle = "rgba(188, 76, 0, 0.5)";
      context.fillRect(0, (att.query + 0.5) * px - scale, canvas.width, 2 * scale);
      const wrap = el("div", { class: "overview", "data-head": head });
      if (all) wrap.append(el("div", { class: "caption" }, `head ${head}`));
      wrap.append(canvas);
      return wrap;
    });
    $("overview-list").replaceChildren(...boxes);
  }

  function onOverviewClick(event) {
    const canvas = event.target.closest("canvas");
    if (!canvas || !att.data) return;
    const n = att.data.tokens.length;
    const rect = canvas.getBoundingClientRect();
    const col = clamp(Math.floor(((event.clientX - rect.left) / rect.width) * n), 0, n - 1);
    const row = clamp(Math.floor(((event.clientY - rect.top) / rect.height) * n), 0, n - 1);
    att.query = row;
    centreWindow(row, col);
    renderGrid(att.data);
    renderArrows(att.data, true);
  }

  function selectQuery(i, scroll) {
    if (!att.data) return;
    att.query = i;
    const { full, rows } = layoutOf(att.data);
    if (!full && (i < att.r0 || i >= att.r0 + rows)) centreWindow(i, null);
    renderGrid(att.data);
    renderArrows(att.data, scroll);
  }

  function lineStyle(relative) {
    return {
      width: MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * relative,
      opacity: MIN_OPACITY + (1 - MIN_OPACITY) * relative,
    };
  }

  // The arrows: queries on the left, keys on the right, a line from the selected query to
  // each key it reads; width and darkness by weight, the weight on hover.
  function renderArrows(data, scroll) {
    const view = $("arrows");
    const n = data.tokens.length;
    const labels = data.labels;
    const i = att.query;
    const heads = shownHeads(data);
    const all = data.head === "all";
    const visible = visibleFn(data);
    const longest = labels.reduce((most, label) => Math.max(most, String(label).length), 1);
    const labelWidth = clamp(longest * 7 + 8, 40, 150);
    const leftX = 8 + labelWidth;
    const rightX = leftX + ARROW_GAP;
    const numbersX = rightX + labelWidth + 6;
    const width = numbersX + (all ? 0 : 56);
    const height = ARROW_TOP + n * ARROW_ROW + 8;
    const rowY = (k) => ARROW_TOP + k * ARROW_ROW + ARROW_ROW / 2;
    const parts = [
      svg("text", { class: "column-title", x: leftX, y: 14, "text-anchor": "end" }, "queries"),
      svg("text", { class: "column-title", x: rightX, y: 14 }, "keys"),
    ];
    if (!all) parts.push(svg("text", { class: "column-title", x: numbersX, y: 14 }, "weight"));
    const lines = svg("g", { class: "lines" });
    parts.push(lines);
    const most = Math.max(...heads.map(({ weights }) => Math.max(0, ...weights[i].filter((w) => typeof w === "number"))));
    const scale = all ? 1 : most || 1;
    const spread = heads.length > 1 ? Math.min(3, (ARROW_ROW * 0.6) / (heads.length - 1)) : 0;
    heads.forEach(({ head, weights }, order) => {
      const offset = (order - (heads.length - 1) / 2) * spread;
      const row = weights[i];
      for (let j = 0; j < n; j++) {
        const weight = row[j];
        if (!(weight > 0)) continue;
        const style = lineStyle(weight / scale);
        const line = svg("line", {
          class: "attention-line",
          "data-query": i,
          "data-key": j,
          "data-head": head,
          "data-weight": String(weight),
          x1: leftX + 6,
          y1: rowY(i) + offset,
          x2: rightX - 6,
          y2: rowY(j) + offset,
          stroke: PALETTE[head % PALETTE.length],
          "stroke-width": style.width.toFixed(2),
          "stroke-opacity": style.opacity.toFixed(3),
        });
        line.append(svg("title", {}, `head ${head}: query ${i} ${labels[i]} → key ${j} ${labels[j]}: ${format(weight)}`));
        lines.append(line);
      }
    });
    for (let k = 0; k < n; k++) {
      const query = svg("text", {
        class: k === i ? "token query selected" : "token query",
        "data-index": k, x: leftX, y: rowY(k), "text-anchor": "end", "dominant-baseline": "middle",
      }, labels[k]);
      query.append(svg("title", {}, `query ${k}: ${quoted(data.tokens[k])}; click to draw its lines`));
      const key = svg("text", {
        class: visible(i, k) ? "token key" : "token key hidden",
        "data-index": k, x: rightX, y: rowY(k), "dominant-baseline": "middle",
      }, labels[k]);
      key.append(svg("title", {}, `key ${k}: ${quoted(data.tokens[k])}`));
      parts.push(query, key);
      if (!all && visible(i, k)) {
        parts.push(svg("text", { class: "weight-label", x: numbersX, y: rowY(k), "dominant-baseline": "middle" },
          format(heads[0].weights[i][k])));
      }
    }
    view.replaceChildren(...parts);
    view.setAttribute("width", String(width));
    view.setAttribute("height", String(height));
    view.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const where = all ? "every head overlaid, one colour per head; line width = the weight itself (0 to 1)"
      : `layer ${data.layer}, head ${data.head}; line width = weight relative to this row's largest, ${format(most)}`;
    $("arrow-note").textContent = `Query ${i} ${labels[i]}: ${where}. Hover a line for its number.`;
    if (scroll) {
      const box = $("arrow-scroll");
      box.scrollTop = Math.max(0, rowY(i) - box.clientHeight / 2);
    }
  }

  function openExplorer() {
    if (!att.request) return;
    const head = att.request.head === "all" ? 0 : att.request.head;
    const params = new URLSearchParams({
      model: att.request.model,
      text: att.request.text,
      layer: String(att.request.layer),
      head: String(head),
      query: String(att.query),
    });
    const url = "/explorer?" + params.toString();
    $("explorer-frame").src = url;
    $("explorer-link").href = url;
    $("explorer-title").textContent = `The explorer: ${att.request.model}, layer ${att.request.layer}, head ${head}, query ${att.query}`;
    $("explorer-box").hidden = false;
    $("explorer-box").scrollIntoView({ block: "nearest" });
  }

  function setUpAttention() {
    $("run").addEventListener("click", () => runAttention());
    const rerun = () => {
      if (att.data) runAttention();
    };
    $("layer-select").addEventListener("change", rerun);
    $("head-select").addEventListener("change", rerun);
    $("open-explorer").addEventListener("click", openExplorer);
    $("explorer-close").addEventListener("click", () => {
      $("explorer-box").hidden = true;
      $("explorer-frame").removeAttribute("src");
    });
    $("attention-grid").addEventListener("click", (event) => {
      const target = event.target.closest("[data-row]");
      if (target) selectQuery(Number(target.dataset.row), true);
    });
    $("arrows").addEventListener("click", (event) => {
      const token = event.target.closest(".token");
      if (token) selectQuery(Number(token.getAttribute("data-index")), false);
    });
    $("overview-list").addEventListener("click", onOverviewClick);
    $("overview-list").addEventListener("keydown", (event) => {
      const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
      if (!moves[event.key]) return;
      event.preventDefault();
      moveWindow(...moves[event.key]);
    });
    $("window-up").addEventListener("click", () => moveWindow(-1, 0));
    $("window-down").addEventListener("click", () => moveWindow(1, 0));
    $("window-left").addEventListener("click", () => moveWindow(0, -1));
    $("window-right").addEventListener("click", () => moveWindow(0, 1));
  }

  // ---- 3. generation, and 4. knocked-out heads ---------------------------------------

  const gen = {
    seq: 0,
    controller: null,
    prompt: "",
    start: null,
    steps: [],
    pending: [], // tokens a streamed run has chosen, before their numbers arrive
    key: null, // settingsKey of the request that made the steps shown
    done: null,
    baseline: null,
    knocked: [],
    view: null, // the step looked at; null: the latest
    layout: null,
    frame: 0,
  };

  function resetGeneration() {
    if (gen.controller) gen.controller.abort();
    gen.controller = null;
    gen.seq += 1;
    gen.start = null;
    gen.steps = [];
    gen.pending = [];
    gen.key = null;
    gen.done = null;
    gen.baseline = null;
    gen.knocked = [];
    gen.view = null;
    renderGeneration();
  }

  function numberField(id) {
    const raw = $(id).value.trim();
    if (raw === "") return null;
    const value = Number(raw);
    return Number.isNaN(value) ? raw : value;
  }

  function checkedHeads() {
    return Array.from(document.querySelectorAll("#ablate-heads input:checked")).map((box) => [
      Number(box.dataset.layer),
      Number(box.dataset.head),
    ]);
  }

  function generateBody(count, ablate) {
    const model = currentModel();
    const seed = numberField("seed");
    return {
      model: model ? model.name : null,
      text: $("prompt-input").value,
      max_new_tokens: count,
      temperature: numberField("temperature") ?? 0,
      top_k: numberField("top-k"),
      top_p: numberField("top-p"),
      seed: seed === null ? 0 : seed,
      ablate,
    };
  }

  // Generate ``count`` tokens from the prompt: in one answer (``streamed`` false) or one NDJSON
  // line per step, each drawn as it arrives. With heads knocked out, the same generation
  // without them comes too (the "before").
  function generate(count, streamed) {
    const model = currentModel();
    if (!model || model.kind !== "decoder") return Promise.resolve();
    if (gen.controller) gen.controller.abort();
    const controller = new AbortController();
    gen.controller = controller;
    const seq = ++gen.seq;
    const current = () => seq === gen.seq;
    const knocked = checkedHeads();
    const body = generateBody(count, knocked);
    // The same settings as the steps on the page, one token more: ask only for the new step
    // (first_step); the tokens before it come out the same, as generation is seeded.
    const key = settingsKey(body);
    const extend = !streamed && gen.done && gen.key === key && count === gen.steps.length + 1 &&
      (!knocked.length || (gen.baseline && gen.baseline.steps.length === gen.steps.length));
    const first = extend ? gen.steps.length : 0;
    body.first_step = first;
    return task("generate", async () => {
      const baseline = knocked.length
        ? api("/api/generate", { ...generateBody(count, []), first_step: first }, controller.signal)
        : Promise.resolve(null);
      if (streamed) {
        gen.prompt = body.text;
        gen.start = null;
        gen.steps = [];
        gen.pending = [];
        gen.done = null;
        gen.baseline = null;
        gen.knocked = knocked;
        gen.view = null;
        renderGeneration();
        const before = baseline.then((result) => {
          if (current()) {
            gen.baseline = result;
            scheduleRender();
          }
        });
        await Promise.all([stream(body, controller.signal, current), before]);
        if (!current()) return;
        if (!gen.done) throw new ApiError("the stream stopped before its last line");
      } else {
        const [result, before] = await Promise.all([api("/api/generate", body, controller.signal), baseline]);
        if (!current()) return;
        const kept = extend && gen.steps.every((step, s) => step.id === result.ids[s]) &&
          (!before || gen.baseline.steps.every((step, s) => step.id === before.ids[s]));
        if (extend && !kept) throw new ApiError("the earlier tokens came out differently: press reset and step again");
        gen.prompt = body.text;
        gen.start = result;
        gen.steps = extend ? gen.steps.concat(result.steps) : result.steps;
        gen.pending = [];
        gen.done = result;
        gen.baseline = before && extend ? { ...before, steps: gen.baseline.steps.concat(before.steps) } : before;
        gen.knocked = knocked;
        gen.view = null;
      }
      gen.key = key;
      model.loaded = true;
      renderModelFacts(currentModel());
      clearError("generate");
      renderGeneration();
    }, current).finally(() => {
      if (gen.controller === controller) gen.controller = null;
    });
  }

  // What must not change between two requests for one step to follow another.
  function settingsKey(body) {
    const { max_new_tokens: _count, first_step: _first, ...settings } = body;
    return JSON.stringify(settings);
  }

  async function stream(body, signal, current) {
    const response = await reach("/api/generate", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/x-ndjson" },
      body: JSON.stringify(body),
      signal,
    });
    if (!response.ok) throw errorOf(await response.text(), response.status);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    const take = (line) => {
      if (!line.trim() || !current()) return;
      const event = JSON.parse(line);
      if (event.event === "start") gen.start = event;
      else if (event.event === "token") gen.pending.push(event); // chosen; its numbers follow
      else if (event.event === "step") gen.steps.push(event);
      else if (event.event === "done") gen.done = event;
      else if (event.event === "error") throw new ApiError(event.error);
      scheduleRender();
    };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, end);
        buffer = buffer.slice(end + 1);
        take(line);
      }
    }
    buffer += decoder.decode();
    take(buffer);
  }

  function scheduleRender() {
    if (gen.frame) return;
    gen.frame = requestAnimationFrame(() => {
      gen.frame = 0;
      renderGeneration();
    });
  }

  function viewedStep() {
    if (!gen.steps.length) return null;
    return gen.view === null ? gen.steps.length - 1 : clamp(gen.view, 0, gen.steps.length - 1);
  }

  function allLabels() {
    if (!gen.start) return [];
    return [...gen.start.prompt_labels, ...gen.steps.map((step) => step.label)];
  }

  function renderGeneration() {
    if (gen.frame) {
      cancelAnimationFrame(gen.frame);
      gen.frame = 0;
    }
    const model = currentModel();
    const notice = $("generate-disabled");
    if (model && model.kind !== "decoder") {
      notice.textContent = `${model.name} is an encoder: it reads the whole text at once, in both directions, and has ` +
        "no next-token head, so it cannot write a next token. Pick a decoder (tiny-induction, tiny-shakespeare, " +
        "stories260K) in the model list to generate.";
      notice.hidden = false;
    } else {
      notice.hidden = true;
    }
    const t = viewedStep();
    renderTokens(t);
    renderStepNav(t);
    renderProbs(t);
    drawStrips(t);
    renderCache(t);
    renderCompare();
    refreshButtons();
  }

  function renderTokens(t) {
    const box = $("tokens");
    if (!gen.start) {
      box.replaceChildren(el("span", { class: "note" }, "Press +1 token to generate one token, or generate max at once."));
      return;
    }
    const parts = [];
    const ids = gen.start.prompt_ids;
    gen.start.prompt_labels.forEach((label, i) => {
      parts.push(el("span", { class: "tok prompt", "data-index": i, "data-id": ids[i], title: `prompt token ${i}: ${quoted(gen.start.prompt_tokens[i])} (id ${ids[i]})` }, label));
    });
    const before = gen.knocked.length && gen.baseline ? gen.baseline.steps : null;
    gen.steps.forEach((step, s) => {
      const index = ids.length + s;
      const span = el("span", {
        class: "tok generated",
        "data-index": index,
        "data-id": step.id,
        "data-generated": "true",
        "data-step": s,
        role: "button",
        tabindex: 0,
        title: `new token ${s + 1}: ${quoted(step.token)} (id ${step.id}), p = ${format(step.p)}; click to look at this step`,
      }, step.label);
      if (s === t) span.classList.add("viewing");
      else if (s > t) span.classList.add("outside");
      if (before && before[s] && before[s].id !== step.id) span.classList.add("differs");
      parts.push(span);
    });
    // Tokens already chosen whose numbers have not arrived yet (a streamed run).
    (gen.pending || []).slice(gen.steps.length).forEach((chosen) => {
      parts.push(el("span", {
        class: "tok generated pending", "data-index": ids.length + chosen.step, "data-id": chosen.id,
        "data-pending": "true", title: `new token ${chosen.step + 1}: ${quoted(chosen.token)} (id ${chosen.id}); its numbers come next`,
      }, chosen.label));
    });
    box.replaceChildren(...parts);
  }

  function renderStepNav(t) {
    const slider = $("step-slider");
    const note = $("step-note");
    if (t === null) {
      slider.disabled = true;
      slider.max = "0";
      slider.value = "0";
      note.textContent = gen.start ? "" : "no step yet";
      return;
    }
    slider.disabled = gen.steps.length < 2;
    slider.max = String(gen.steps.length - 1);
    slider.value = String(t);
    const step = gen.steps[t];
    const total = gen.done ? gen.done.steps_total : gen.steps.length;
    note.textContent = `step ${t + 1} of ${total}: chose ${step.label} (id ${step.id}) with p = ${format(step.p)}` +
      (t < gen.steps.length - 1 ? " · looking back" : "");
  }

  function probsItems(step, list) {
    if (!step) {
      list.replaceChildren();
      return;
    }
    list.replaceChildren(
      ...step.top.map((entry) => {
        const chosen = entry.id === step.id;
        const item = el("li", {
          "data-token": entry.token,
          "data-p": String(entry.p),
          "data-id": entry.id,
          title: `${quoted(entry.token)} (id ${entry.id}): p = ${entry.p}${chosen ? " · the token taken" : ""}`,
        });
        if (chosen) {
          item.classList.add("chosen");
          item.setAttribute("aria-current", "true");
        }
        const track = el("span", { class: "bar-track" });
        const bar = el("span", { class: "bar" });
        bar.style.width = `${(Math.max(0, Math.min(1, entry.p)) * 100).toFixed(2)}%`;
        track.append(bar);
        item.append(el("span", { class: "label" }, entry.label), track, el("span", { class: "p" }, format(entry.p)));
        return item;
      })
    );
  }

  function renderProbs(t) {
    const step = t === null ? null : gen.steps[t];
    const options = gen.start && gen.start.options;
    let title = "Next-token probabilities";
    if (step) {
      title += `, step ${t + 1}`;
      title += options && options.temperature > 0 ? " (what the token was drawn from)" : " (softmax; greedy takes the top one)";
    }
    $("probs-title").textContent = title;
    probsItems(step, $("next-token-probs"));
    const showBefore = Boolean(gen.knocked.length && gen.baseline);
    $("before-box").hidden = !showBefore;
    $("probs-now").hidden = !showBefore;
    probsItems(showBefore && t !== null ? gen.baseline.steps[t] : null, $("next-token-probs-before"));
  }

  // One strip per layer x head: the viewed step's query over every cache entry.
  function drawStrips(t) {
    const canvas = $("strips");
    const context = canvas.getContext("2d");
    const step = t === null ? null : gen.steps[t];
    if (!step) {
      canvas.width = 1;
      canvas.height = 1;
      canvas.style.width = "1px";
      canvas.style.height = "1px";
      gen.layout = null;
      return;
    }
    const attention = step.attention;
    const layers = attention.length;
    const heads = attention[0].length;
    const keys = attention[0][0].length;
    const available = Math.max(320, ($("generate").clientWidth || 720) - 8);
    const labelWidth = 52;
    const keyWidth = clamp(Math.floor((available - labelWidth - 4) / keys), 1, 36);
    const rowHeight = clamp(Math.floor(250 / (layers * heads)), 5, 12);
    const layerGap = 4;
    const top = keyWidth >= 11 ? 44 : 6;
    const width = labelWidth + keys * keyWidth + 4;
    const height = top + layers * heads * rowHeight + (layers - 1) * layerGap + 4;
    const scale = devicePixels();
    canvas.width = Math.round(width * scale);
    canvas.height = Math.round(height * scale);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    context.setTransform(scale, 0, 0, scale, 0, 0);
    context.fillStyle = "#ffffff";
    context.fillRect(0, 0, width, height);
    const labels = allLabels();
    const start = step.cache.start;
    context.font = "9px system-ui, sans-serif";
    context.textBaseline = "middle";
    if (top > 6) {
      context.save();
      context.fillStyle = "#59636e";
      for (let j = 0; j < keys; j++) {
        context.save();
        context.translate(labelWidth + j * keyWidth + keyWidth / 2, top - 3);
        context.rotate(-Math.PI / 2);
        context.fillText(String(labels[start + j] ?? "").slice(0, 8), 0, 0);
        context.restore();
      }
      context.restore();
    }
    const chosenLayer = Number($("cache-layer").value);
    const chosenHead = Number($("cache-head").value);
    const rowTop = (l, h) => top + (l * heads + h) * rowHeight + l * layerGap;
    for (let l = 0; l < layers; l++) {
      const [lo, hi] = step.cache.reads[l];
      for (let h = 0; h < heads; h++) {
        const y = rowTop(l, h);
        context.fillStyle = "#59636e";
        if (rowHeight >= 9) context.fillText(`L${l} H${h}`, 2, y + rowHeight / 2);
        else if (h === 0) context.fillText(`layer ${l}`, 2, y + (heads * rowHeight) / 2);
        const row = attention[l][h];
        for (let j = 0; j < keys; j++) {
          context.fillStyle = j >= lo && j < hi ? colour(row[j]) : "#d8dde3";
          context.fillRect(labelWidth + j * keyWidth, y, Math.max(1, keyWidth - (keyWidth > 3 ? 1 : 0)), rowHeight - 1);
        }
      }
    }
    if (chosenLayer < layers && chosenHead < heads) {
      context.strokeStyle = "#bc4c00";
      context.lineWidth = 1.5;
      context.strokeRect(labelWidth - 1, rowTop(chosenLayer, chosenHead) - 1, keys * keyWidth + 1, rowHeight + 1);
    }
    gen.layout = { labelWidth, keyWidth, rowHeight, layerGap, top, layers, heads, keys, step: t };
  }

  function stripAt(event) {
    const layout = gen.layout;
    if (!layout) return null;
    const rect = $("strips").getBoundingClientRect();
    const x = event.clientX - rect.left;
    const y = event.clientY - rect.top - layout.top;
    if (y < 0) return null;
    const band = layout.heads * layout.rowHeight + layout.layerGap;
    const l = Math.floor(y / band);
    const h = Math.floor((y - l * band) / layout.rowHeight);
    if (l >= layout.layers || h >= layout.heads || h < 0) return null;
    const j = Math.floor((x - layout.labelWidth) / layout.keyWidth);
    return { l, h, j: j >= 0 && j < layout.keys ? j : null };
  }

  function renderCache(t) {
    const box = $("cache");
    const note = $("cache-note");
    const step = t === null ? null : gen.steps[t];
    if (!step) {
      box.replaceChildren();
      note.textContent = gen.start ? "" : "The cache appears with the first step.";
      return;
    }
    const layer = clamp(Number($("cache-layer").value) || 0, 0, step.attention.length - 1);
    const head = clamp(Number($("cache-head").value) || 0, 0, step.attention[layer].length - 1);
    const { length, start, reads } = step.cache;
    const [lo, hi] = reads[layer];
    const labels = allLabels();
    const weights = step.attention[layer][head];
    const boxes = [];
    for (let j = 0; j < length; j++) {
      const position = start + j;
      const read = j >= lo && j < hi;
      const entry = el("span", {
        class: "cache-box",
        "data-index": position,
        "data-entry": j,
        "data-weight": String(weights[j]),
        title: `cache entry ${j}: token ${position} ${quoted(labels[position] ?? "")}: ` +
          (read ? `weight ${format(weights[j])}` : "not read (outside the window)"),
      }, labels[position] ?? "?");
      if (!read) {
        entry.classList.add("unread");
        entry.dataset.read = "false";
      } else {
        entry.style.background = colour(weights[j]);
        if (shade(weights[j]) > 0.62) entry.classList.add("dark");
      }
      if (j === length - 1) entry.classList.add("newest");
      boxes.push(entry);
    }
    box.replaceChildren(...boxes);
    let said = `cache: ${length} entries; the new query reads ${hi - lo}` +
      ` (layer ${layer}, head ${head}; outlined: the newest entry, the query itself).`;
    if (start > 0) said += ` The window slid: the first ${start} tokens are no longer in the cache.`;
    note.textContent = said;
  }

  function textSpans(target, steps, other) {
    const parts = [el("span", { class: "prompt" }, gen.prompt)];
    steps.forEach((step, s) => {
      const span = el("span", { "data-step": s, "data-id": step.id }, step.text);
      if (other && other[s] && other[s].id !== step.id) span.classList.add("differs");
      parts.push(span);
    });
    target.replaceChildren(...parts);
  }

  function renderCompare() {
    const box = $("knockout-compare");
    const shown = Boolean(gen.knocked.length && gen.baseline && gen.steps.length);
    box.hidden = !shown;
    if (!shown) return;
    const before = gen.baseline.steps;
    const after = gen.steps;
    textSpans($("text-before"), before, after);
    textSpans($("text-after"), after, before);
    $("knocked-list").textContent = gen.knocked.map(([l, h]) => `layer ${l} head ${h}`).join(", ") + " knocked out";
    const count = Math.min(before.length, after.length);
    let first = -1;
    for (let s = 0; s < count; s++) {
      if (before[s].id !== after[s].id) {
        first = s;
        break;
      }
    }
    $("compare-note").textContent = first >= 0
      ? `The first different token is new token ${first + 1}: ${before[first].label} before, ${after[first].label} after.`
      : `The same ${count} tokens either way: these heads move the probabilities (compare the two lists) but ` +
        "change no choice here.";
  }

  function buildAblationGrid(model) {
    const box = $("ablate-heads");
    if (!model || model.kind !== "decoder") {
      box.replaceChildren(el("p", { class: "note" }, model ? "Knocking out heads needs a decoder: it changes what is generated." : ""));
      return;
    }
    const table = el("table");
    const headRow = el("tr");
    headRow.append(el("th", {}, ""));
    const group = model.heads / (model.kv_heads || model.heads);
    for (let h = 0; h < model.heads; h++) {
      const title = group > 1 ? `head ${h} reads key/value head ${Math.floor(h / group)}` : `head ${h}`;
      headRow.append(el("th", { scope: "col", title }, `h${h}`));
    }
    table.append(el("thead"));
    table.tHead.append(headRow);
    const body = el("tbody");
    for (let l = 0; l < model.layers; l++) {
      const row = el("tr");
      row.append(el("th", { scope: "row" }, `layer ${l}`));
      for (let h = 0; h < model.heads; h++) {
        const cell = el("td");
        cell.append(el("input", {
          type: "checkbox",
          "data-layer": l,
          "data-head": h,
          "aria-label": `knock out layer ${l} head ${h}`,
          title: `layer ${l} head ${h}`,
        }));
        row.append(cell);
      }
      body.append(row);
    }
    table.append(body);
    box.replaceChildren(table);
  }

  function onAblationChange() {
    if (gen.steps.length) generate(gen.steps.length, false);
    else renderGeneration();
  }

  function onOptionsChange() {
    if (gen.steps.length) generate(gen.steps.length, false);
  }

  function setUpGeneration() {
    $("generate-step").addEventListener("click", () => generate(gen.steps.length + 1, false));
    $("generate-run").addEventListener("click", () => {
      const count = numberField("generate-count");
      generate(count === null ? null : count, true);
    });
    $("generate-reset").addEventListener("click", () => {
      resetGeneration();
      clearError("generate");
    });
    $("prompt-input").addEventListener("input", resetGeneration);
    $("temperature-slider").addEventListener("input", () => {
      $("temperature").value = $("temperature-slider").value;
    });
    $("temperature").addEventListener("input", () => {
      const value = Number($("temperature").value);
      if (!Number.isNaN(value)) $("temperature-slider").value = String(Math.min(2, value));
    });
    for (const id of ["temperature-slider", "temperature", "top-k", "top-p", "seed"]) {
      $(id).addEventListener("change", onOptionsChange);
    }
    $("ablate-heads").addEventListener("change", onAblationChange);
    $("ablate-clear").addEventListener("click", () => {
      const any = checkedHeads().length > 0;
      document.querySelectorAll("#ablate-heads input").forEach((box) => {
        box.checked = false;
      });
      if (any) onAblationChange();
    });
    $("step-slider").addEventListener("input", () => {
      const value = Number($("step-slider").value);
      gen.view = value >= gen.steps.length - 1 ? null : value;
      renderGeneration();
    });
    const pickToken = (event) => {
      const token = event.target.closest(".tok.generated");
      if (!token) return;
      const s = Number(token.dataset.step);
      gen.view = s >= gen.steps.length - 1 ? null : s;
      renderGeneration();
    };
    $("tokens").addEventListener("click", pickToken);
    $("tokens").addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        pickToken(event);
      }
    });
    $("strips").addEventListener("mousemove", (event) => {
      const at = stripAt(event);
      const step = gen.layout ? gen.steps[gen.layout.step] : null;
      if (!at || at.j === null || !step) {
        $("strip-readout").textContent = "\u00a0";
        return;
      }
      const position = step.cache.start + at.j;
      const [lo, hi] = step.cache.reads[at.l];
      const weight = step.attention[at.l][at.h][at.j];
      const label = allLabels()[position];
      $("strip-readout").textContent = `layer ${at.l}, head ${at.h} → cache entry ${at.j} (token ${position}, ${label}): ` +
        (at.j >= lo && at.j < hi ? format(weight) : "not read");
    });
    $("strips").addEventListener("mouseleave", () => {
      $("strip-readout").textContent = "\u00a0";
    });
    $("strips").addEventListener("click", (event) => {
      const at = stripAt(event);
      if (!at) return;
      $("cache-layer").value = String(at.l);
      $("cache-head").value = String(at.h);
      renderGeneration();
    });
    $("cache-layer").addEventListener("change", renderGeneration);
    $("cache-head").addEventListener("change", renderGeneration);
    let resizeTimer = null;
    window.addEventListener("resize", () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => drawStrips(viewedStep()), 150);
    });
  }

  // ---- start -------------------------------------------------------------------------

  setUpTabs();
  setUpWalk();
  setUpAttention();
  setUpGeneration();
  $("model-select").addEventListener("change", onModelChange);
  renderGeneration();
  walkRequest(null);
  loadModels();
})();
