// Tab 2, a model's attention (/api/attention): runs a text through the picked model, then
// shows one layer's weights (live-attention-grid.js), the selected query's arrows
// (live-arrows.js), a list of facts about the mask, the positions and the heads, and the
// explorer's step-by-step numbers in a frame.

import {
  $, api, clamp, clearError, closeFrame, el, explorerUrl, isBusy, newRequest, openFrame, spanText, task,
} from "./live-common.js";
import { currentModel, markLoaded } from "./live-models.js";
import { centreWindow, moveWindow, outsideWindow, renderGrid } from "./live-attention-grid.js";
import { renderArrows } from "./live-arrows.js";

// The tab's state: the answer shown and the request that made it, the selected query and
// the window of cells (first row r0, first column c0).
const att = { seq: 0, data: null, request: null, query: 0, r0: 0, c0: 0 };

// The window arrows' moves, in rows and columns, by key and by button.
const MOVES = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
const MOVE_BUTTONS = { "window-up": "ArrowUp", "window-down": "ArrowDown", "window-left": "ArrowLeft", "window-right": "ArrowRight" };

export function refreshAttentionButtons() {
  $("run").disabled = isBusy("attention") || !currentModel();
  $("open-explorer").disabled = !att.data;
}

export function resetAttention() {
  att.seq += 1; // a request still on its way is now stale
  att.data = null;
  att.request = null;
  $("attention-result").hidden = true;
  $("attention-facts").replaceChildren();
  $("attention-grid").replaceChildren();
  closeFrame("explorer-box", "explorer-frame");
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
  const current = newRequest(att);
  return task("attention", async () => {
    const data = await api("/api/attention", body);
    if (!current()) return;
    clearError("attention");
    const n = data.tokens.length;
    const sameText = att.request && att.request.text === body.text && att.request.model === body.model;
    att.data = data;
    att.request = body;
    if (!sameText || att.query >= n) att.query = data.causal ? n - 1 : Math.min(1, n - 1);
    markLoaded(model);
    centreWindow(att, att.query, null);
    $("attention-result").hidden = false;
    renderFacts(data);
    drawQuery(true);
    refreshAttentionButtons();
  }, current);
}

// The grid and the selected query's arrows (``scroll``: scrolled into view).
function drawQuery(scroll) {
  renderGrid(att);
  renderArrows(att.data, att.query, scroll);
}

// The heads that read key/value head ``kv``.
function headsReading(kvOf, kv) {
  return kvOf.map((k, h) => (k === kv ? h : -1)).filter((h) => h >= 0);
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
        groups.push(`key/value head ${kv}: heads ${spanText(headsReading(kvOf, kv))}`);
      }
      items.push(groups.join("; ") + ".");
    } else {
      const kv = kvOf[data.head];
      items.push(`Head ${data.head} reads key/value head ${kv}, shared with heads ${spanText(headsReading(kvOf, kv))}.`);
    }
  } else if (heads) {
    items.push("Every head has its own keys and values.");
  }
  $("attention-facts").replaceChildren(...items.map((text) => el("li", {}, text)));
}

function selectQuery(i, scroll) {
  if (!att.data) return;
  att.query = i;
  if (outsideWindow(att, i)) centreWindow(att, i, null);
  drawQuery(scroll);
}

// A click on an overview: that point's query, with the window of cells around the point.
function onOverviewClick(event) {
  const canvas = event.target.closest("canvas");
  if (!canvas || !att.data) return;
  const n = att.data.tokens.length;
  const rect = canvas.getBoundingClientRect();
  const col = clamp(Math.floor(((event.clientX - rect.left) / rect.width) * n), 0, n - 1);
  const row = clamp(Math.floor(((event.clientY - rect.top) / rect.height) * n), 0, n - 1);
  att.query = row;
  centreWindow(att, row, col);
  drawQuery(true);
}

function openExplorer() {
  if (!att.request) return;
  const { model, text, layer } = att.request;
  const head = att.request.head === "all" ? 0 : att.request.head;
  const url = explorerUrl({ model, text, layer: String(layer), head: String(head), query: String(att.query) });
  $("explorer-link").href = url;
  $("explorer-title").textContent = `The explorer: ${model}, layer ${layer}, head ${head}, query ${att.query}`;
  openFrame("explorer-box", "explorer-frame", url);
}

export function setUpAttention() {
  $("run").addEventListener("click", () => runAttention());
  const rerun = () => {
    if (att.data) runAttention();
  };
  $("layer-select").addEventListener("change", rerun);
  $("head-select").addEventListener("change", rerun);
  $("open-explorer").addEventListener("click", openExplorer);
  $("explorer-close").addEventListener("click", () => closeFrame("explorer-box", "explorer-frame"));
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
    if (!MOVES[event.key]) return;
    event.preventDefault();
    moveWindow(att, ...MOVES[event.key]);
  });
  for (const [id, key] of Object.entries(MOVE_BUTTONS)) {
    $(id).addEventListener("click", () => moveWindow(att, ...MOVES[key]));
  }
}
