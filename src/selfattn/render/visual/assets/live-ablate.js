// Tab 3's knocked-out heads: one checkbox per layer x head (a ticked head's output is set to
// zero at every step), "Untick all", and the generated text before and after, with the
// first token that differs.

import { $, el, isBusy, tableOf } from "./live-common.js";
import { decoderPicked } from "./live-models.js";

const BOXES = "#ablate-heads input";

// The heads ticked, as [layer, head] pairs.
export function checkedHeads() {
  return Array.from(document.querySelectorAll(`${BOXES}:checked`)).map((box) => [
    Number(box.dataset.layer),
    Number(box.dataset.head),
  ]);
}

export function refreshAblationButtons() {
  const off = isBusy("generate") || !decoderPicked();
  $("ablate-clear").disabled = off;
  document.querySelectorAll(BOXES).forEach((box) => {
    box.disabled = off;
  });
}

export function buildAblationGrid(model) {
  const box = $("ablate-heads");
  if (!model || model.kind !== "decoder") {
    box.replaceChildren(el("p", { class: "note" }, model ? "Knocking out heads needs a decoder: it changes what is generated." : ""));
    return;
  }
  const group = model.heads / (model.kv_heads || model.heads);
  const headCells = [el("th", {}, "")];
  for (let h = 0; h < model.heads; h++) {
    const title = group > 1 ? `head ${h} reads key/value head ${Math.floor(h / group)}` : `head ${h}`;
    headCells.push(el("th", { scope: "col", title }, `h${h}`));
  }
  const rows = [];
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
    rows.push(row);
  }
  box.replaceChildren(tableOf(headCells, rows));
}

// The prompt, then one span per new token; those that differ from ``other`` marked.
function textSpans(target, prompt, steps, other) {
  const parts = [el("span", { class: "prompt" }, prompt)];
  steps.forEach((step, s) => {
    const span = el("span", { "data-step": s, "data-id": step.id }, step.text);
    if (other && other[s] && other[s].id !== step.id) span.classList.add("differs");
    parts.push(span);
  });
  target.replaceChildren(...parts);
}

// Before and after, from ``gen`` (the generation's state, live-generate.js): shown while heads
// are knocked out and both generations have steps.
export function renderCompare(gen) {
  const box = $("knockout-compare");
  const shown = Boolean(gen.knocked.length && gen.baseline && gen.steps.length);
  box.hidden = !shown;
  if (!shown) return;
  const before = gen.baseline.steps;
  const after = gen.steps;
  textSpans($("text-before"), gen.prompt, before, after);
  textSpans($("text-after"), gen.prompt, after, before);
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

// A tick, an untick or "Untick all" (when any was ticked) calls ``onChange``.
export function setUpAblation(onChange) {
  $("ablate-heads").addEventListener("change", onChange);
  $("ablate-clear").addEventListener("click", () => {
    const any = checkedHeads().length > 0;
    document.querySelectorAll(BOXES).forEach((box) => {
      box.checked = false;
    });
    if (any) onChange();
  });
}
