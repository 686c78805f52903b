// Tab 1, the seed's walkthrough (/api/explain): the hand-made example of `selfattn explain`,
// one query at a time, from the embeddings through scores, exp and weights to its context
// vector, and the explorer for the same sentence in a frame.

import {
  $, PRECISION, api, clearError, closeFrame, debounced, el, explorerUrl, format, newRequest, openFrame, quoted,
  tableOf, task,
} from "./live-common.js";

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

export function walkRequest(query) {
  const body = walkBody(query);
  const current = newRequest(walk);
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
  const boxes = [];
  for (let h = 0; h < heads; h++) boxes.push(headBox(data, h, multi, projected));
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

// Head ``h``'s scores, exp and weights for every key, and its largest score and sum of exp.
function headBox(data, h, multi, projected) {
  const q = data.query;
  const kvOf = data.multihead ? data.multihead.kv_head_of : null;
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
  const rows = data.tokens.map((token, j) => {
    const row = el("tr", { "data-key": j });
    if (j === q.index) row.classList.add("query");
    if (typeof scores[j] !== "number") row.classList.add("masked");
    row.append(el("th", { scope: "row", title: `token ${j}` }, j === q.index ? `${token} ← query` : token));
    columns.forEach((c) => row.append(el("td", { "data-col": c.key, "data-key": j, "data-head": h }, format(c.values[j]))));
    return row;
  });
  const headCells = [
    el("th", { scope: "col" }, "key"),
    ...columns.map((c) => el("th", { scope: "col", "data-col": c.key }, c.label)),
  ];
  box.append(tableOf(headCells, rows, { "data-head": h }));
  const sums = el("p", { class: "sums" });
  if (q.max !== undefined) {
    sums.append("m (largest score) = ", el("span", { "data-col": "max", "data-head": h }, format(perHead(q.max, h, multi))), " · ");
  }
  sums.append("sum of exp = ", el("span", { "data-col": "exp_sum", "data-head": h }, format(perHead(q.exp_sum, h, multi))));
  box.append(sums);
  return box;
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
  const bodyRows = rows.map((row) => {
    const tr = el("tr", row.attributes);
    if (row.query) tr.classList.add("query");
    tr.append(el("th", { scope: "row" }, row.label));
    row.values.forEach((value, k) => tr.append(el("td", { "data-col": column, "data-dim": k }, format(value))));
    return tr;
  });
  return tableOf(headers.map((text) => el("th", { scope: "col" }, text)), bodyRows);
}

// The variants and positional encodings come from the server, the names `selfattn explain`
// takes: the page keeps no list of its own to go stale.
export async function fillWalkOptions() {
  const names = await api("/api/variants");
  for (const [id, values] of [["walk-variant", names.variants], ["walk-positional", names.positional]]) {
    $(id).replaceChildren(...values.map((value) => el("option", { value }, value)));
  }
}

export function setUpWalk() {
  $("walk-tokens").addEventListener("click", (event) => {
    const button = event.target.closest("button[data-index]");
    if (button) walkRequest(Number(button.dataset.index));
  });
  const again = debounced("walk", () => walkRequest(keptQuery()), 350);
  $("walk-sentence").addEventListener("input", again);
  for (const id of ["walk-variant", "walk-positional"]) {
    $(id).addEventListener("change", () => walkRequest(walk.query));
  }
  $("walk-explorer").addEventListener("click", () => {
    const { text, variant, positional, query } = walkBody(walk.query);
    const fields = query === undefined ? { text, variant, positional } : { text, variant, positional, query };
    openFrame("walk-frame-box", "walk-frame", explorerUrl(fields));
  });
  $("walk-frame-close").addEventListener("click", () => closeFrame("walk-frame-box", "walk-frame"));
}
