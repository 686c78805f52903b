// Tab 2's arrows: queries on the left, keys on the right, a line from the selected query to
// each key it reads. A line's width and opacity grow with its weight (relative to the row's
// largest for one head; the weight itself when every head is overlaid), as in the explorer;
// hovering a line shows its number.

import { $, PALETTE, clamp, format, quoted, svg } from "./live-common.js";
import { shownHeads, visibleFn } from "./live-attention-grid.js";

const MIN_WIDTH = 0.5;
const MAX_WIDTH = 7;
const MIN_OPACITY = 0.15;
const ARROW_ROW = 18;
const ARROW_TOP = 26;
const ARROW_GAP = 170;

function lineStyle(relative) {
  return {
    width: MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * relative,
    opacity: MIN_OPACITY + (1 - MIN_OPACITY) * relative,
  };
}

// Draw query ``i``'s lines for ``data`` (an answer of /api/attention); ``scroll``: bring the
// query into view.
export function renderArrows(data, i, scroll) {
  const view = $("arrows");
  const n = data.tokens.length;
  const labels = data.labels;
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
