// Tab 2's weight grids: one matrix of cells per head shown (rows are queries, columns keys).
// Up to FULL_GRID_MAX tokens every cell is an element; past it a canvas overview shows every
// weight of a head as one pixel, and only a window of cells (outlined there) is built.
// ``view`` is the tab's state: data (the answer of /api/attention), query, r0 and c0 (the
// window's first row and column).

import { $, PALETTE, clamp, colour, colourRGB, el, format, quoted, sizeCanvas } from "./live-common.js";

// n x n elements would freeze the page.
const FULL_GRID_MAX = 48;
const FULL_GRID_MAX_CELLS = 8000; // every head of a layer at once: at most this many cells in all
const WINDOW = { rows: 32, cols: 48 };
const WINDOW_ALL = { rows: 16, cols: 16 };

// Every head shown: [{head, weights (n x n)}].
export function shownHeads(data) {
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

// Whether query i may read key j.
export function visibleFn(data) {
  const ranges = data.mask_ranges;
  return (i, j) => !ranges || (j >= ranges[i][0] && j < ranges[i][1]);
}

// Put the window of cells around row ``row`` and column ``col`` (null: where the row's weights are).
export function centreWindow(view, row, col) {
  if (!view.data) return;
  const { n, rows, cols } = layoutOf(view.data);
  view.r0 = clamp(row - Math.floor(rows / 2), 0, n - rows);
  if (col === null) {
    // A causal row has its weights at and before the diagonal: put the query's column near the right.
    const anchor = view.data.causal ? row - cols + Math.ceil(cols / 6) : row - Math.floor(cols / 2);
    view.c0 = clamp(anchor, 0, n - cols);
  } else {
    view.c0 = clamp(col - Math.floor(cols / 2), 0, n - cols);
  }
}

// Move the window by half its height and width, ``rowSteps`` down and ``colSteps`` right.
export function moveWindow(view, rowSteps, colSteps) {
  if (!view.data) return;
  const { n, rows, cols } = layoutOf(view.data);
  view.r0 = clamp(view.r0 + rowSteps * Math.max(1, Math.floor(rows / 2)), 0, n - rows);
  view.c0 = clamp(view.c0 + colSteps * Math.max(1, Math.floor(cols / 2)), 0, n - cols);
  renderGrid(view);
}

// Whether query ``i`` lies outside the window of cells (there is one: the grid is not full).
export function outsideWindow(view, i) {
  const { full, rows } = layoutOf(view.data);
  return !full && (i < view.r0 || i >= view.r0 + rows);
}

function cellTitle(data, i, j, weight, visible) {
  const labels = data.labels;
  const said = `query ${i} ${labels[i]} → key ${j} ${labels[j]}: ${format(weight)}`;
  return visible ? said : `${said} (masked: query ${i} may not read key ${j})`;
}

export function renderGrid(view) {
  const data = view.data;
  const layout = layoutOf(data);
  const { n, all, full, rows, cols } = layout;
  view.r0 = clamp(view.r0, 0, n - rows);
  view.c0 = clamp(view.c0, 0, n - cols);
  const rowRange = full ? [0, n] : [view.r0, view.r0 + rows];
  const colRange = full ? [0, n] : [view.c0, view.c0 + cols];
  const heads = shownHeads(data);
  const cell = all
    ? clamp(Math.floor(150 / cols), 5, 14)
    : clamp(Math.floor((full ? 560 : 640) / cols), 10, 24);
  const grid = $("attention-grid");
  grid.dataset.n = String(n);
  grid.dataset.mode = full ? "full" : "window";
  grid.dataset.rows = `${rowRange[0]}-${rowRange[1]}`;
  grid.dataset.cols = `${colRange[0]}-${colRange[1]}`;
  grid.replaceChildren(
    ...heads.map(({ head, weights }) => headGrid(data, view.query, head, weights, rowRange, colRange, all, cell))
  );
  $("overview-box").hidden = full;
  if (!full) {
    renderOverviews(view, heads, layout);
    $("window-note").textContent =
      `${n} tokens: the canvas shows every weight; the cells below are queries ${rowRange[0]}–${rowRange[1] - 1} ` +
      `× keys ${colRange[0]}–${colRange[1] - 1}. Click the canvas or use the arrows to move them.`;
  }
}

function headGrid(data, query, head, weights, rowRange, colRange, small, cell) {
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
      if (j === query) label.classList.add("query-col");
      matrix.append(label);
    }
    matrix.style.gridTemplateRows = "auto";
  }
  for (let i = rowRange[0]; i < rowRange[1]; i++) {
    if (!small) {
      const label = el("div", { class: "row-label", "data-row": i, title: `query ${i}: ${quoted(data.tokens[i])}` }, labels[i]);
      if (i === query) label.classList.add("query-row");
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
      if (i === query) c.classList.add("in-query");
      matrix.append(c);
    }
  }
  box.append(matrix);
  return box;
}

// Every weight of a head as one pixel (masked ones grey), on an n x n canvas.
function weightImage(n, weights, visible) {
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
      const [r, g, b] = visible(i, j) ? colourRGB(row[j]) : [222, 226, 231]; // masked: grey
      pixels[at] = r;
      pixels[at + 1] = g;
      pixels[at + 2] = b;
      pixels[at + 3] = 255;
    }
  }
  offContext.putImageData(image, 0, 0);
  return off;
}

// The overviews: each head's weight image, scaled up; the window of cells is the outlined
// rectangle, the selected query a line across.
function renderOverviews(view, heads, layout) {
  const { n, all } = layout;
  const size = all ? 150 : 260;
  const visible = visibleFn(view.data);
  const boxes = heads.map(({ head, weights }) => {
    const canvas = el("canvas", {
      "data-testid": "overview",
      "data-head": head,
      tabindex: 0,
      title: "every weight of this head; click to move the cells there",
      "aria-label": `overview of head ${head}: click a point to show its cells`,
    });
    const scale = sizeCanvas(canvas, size, size);
    const context = canvas.getContext("2d");
    context.imageSmoothingEnabled = false;
    context.drawImage(weightImage(n, weights, visible), 0, 0, canvas.width, canvas.height);
    const px = canvas.width / n;
    context.strokeStyle = "#bc4c00";
    context.lineWidth = 2 * scale;
    context.strokeRect(view.c0 * px, view.r0 * px, layout.cols * px, layout.rows * px);
    context.fillStyle = "rgba(188, 76, 0, 0.5)";
    context.fillRect(0, (view.query + 0.5) * px - scale, canvas.width, 2 * scale);
    const wrap = el("div", { class: "overview", "data-head": head });
    if (all) wrap.append(el("div", { class: "caption" }, `head ${head}`));
    wrap.append(canvas);
    return wrap;
  });
  $("overview-list").replaceChildren(...boxes);
}
