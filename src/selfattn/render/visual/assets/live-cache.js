// Tab 3's key/value cache: the cache entries of the step looked at, shaded by one layer and
// head's weights, and a canvas of strips, one per layer x head, each the new token's query
// over every cache entry (hover for a number, click to shade the cache with that head).
// ``gen`` is the generation's state (live-generate.js).

import { $, clamp, colour, el, format, quoted, shade, sizeCanvas } from "./live-common.js";
import { viewedStep } from "./live-tokens.js";

const BLANK = "\u00a0"; // the readout's text while no strip is hovered
let strips = null; // where drawStrips put the strips: sizes, counts and the step drawn

// The label of every token so far: the prompt's, then the new ones.
function allLabels(gen) {
  if (!gen.start) return [];
  return [...gen.start.prompt_labels, ...gen.steps.map((step) => step.label)];
}

// One strip per layer x head: step ``t``'s query over every cache entry.
export function drawStrips(gen, t) {
  const canvas = $("strips");
  const context = canvas.getContext("2d");
  const step = t === null ? null : gen.steps[t];
  if (!step) {
    canvas.width = 1;
    canvas.height = 1;
    canvas.style.width = "1px";
    canvas.style.height = "1px";
    strips = null;
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
  const scale = sizeCanvas(canvas, width, height);
  context.setTransform(scale, 0, 0, scale, 0, 0);
  context.fillStyle = "#ffffff";
  context.fillRect(0, 0, width, height);
  const labels = allLabels(gen);
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
  strips = { labelWidth, keyWidth, rowHeight, layerGap, top, layers, heads, keys, step: t };
}

// The strip under the mouse: layer l, head h and cache entry j (null: left of the entries).
function stripAt(event) {
  if (!strips) return null;
  const rect = $("strips").getBoundingClientRect();
  const x = event.clientX - rect.left;
  const y = event.clientY - rect.top - strips.top;
  if (y < 0) return null;
  const band = strips.heads * strips.rowHeight + strips.layerGap;
  const l = Math.floor(y / band);
  const h = Math.floor((y - l * band) / strips.rowHeight);
  if (l >= strips.layers || h >= strips.heads || h < 0) return null;
  const j = Math.floor((x - strips.labelWidth) / strips.keyWidth);
  return { l, h, j: j >= 0 && j < strips.keys ? j : null };
}

export function renderCache(gen, t) {
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
  const labels = allLabels(gen);
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

// The strips' readout and clicks, the cache's layer and head, and redrawing the strips when
// the window's width changes; ``rerender`` shows the generation again.
export function setUpCache(gen, rerender) {
  $("strips").addEventListener("mousemove", (event) => {
    const at = stripAt(event);
    const step = strips ? gen.steps[strips.step] : null;
    if (!at || at.j === null || !step) {
      $("strip-readout").textContent = BLANK;
      return;
    }
    const position = step.cache.start + at.j;
    const [lo, hi] = step.cache.reads[at.l];
    const weight = step.attention[at.l][at.h][at.j];
    const label = allLabels(gen)[position];
    $("strip-readout").textContent = `layer ${at.l}, head ${at.h} → cache entry ${at.j} (token ${position}, ${label}): ` +
      (at.j >= lo && at.j < hi ? format(weight) : "not read");
  });
  $("strips").addEventListener("mouseleave", () => {
    $("strip-readout").textContent = BLANK;
  });
  $("strips").addEventListener("click", (event) => {
    const at = stripAt(event);
    if (!at) return;
    $("cache-layer").value = String(at.l);
    $("cache-head").value = String(at.h);
    rerender();
  });
  $("cache-layer").addEventListener("change", rerender);
  $("cache-head").addEventListener("change", rerender);
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => drawStrips(gen, viewedStep(gen)), 150);
  });
}
