// What every part of the live page shares: DOM helpers, the number format and the colour
// scale, requests to the page's own server (the JSON API in selfattn/serve/app.py), and the
// busy state ("working…", data-pending, the buttons that wait) with the message line.
// Numbers are printed with toFixed(4) (toExponential from 1e10 up, or below 1e-10 when not
// 0), as `selfattn explain` prints them. Data reaches the page as text only (textContent,
// attributes), never as markup; styles are set through classes or the CSSOM, which the
// page's Content-Security-Policy allows.

export const PRECISION = 4;
const SCIENTIFIC_FROM = 1e10; // as selfattn.formatting.SCIENTIFIC_FROM and SCIENTIFIC_BELOW
const SCIENTIFIC_BELOW = 1e-10;
const DARKEST = [11, 77, 158]; // the colour of weight 1; weight 0 is white
export const PALETTE = [
  "#0969da", "#d1242f", "#1a7f37", "#8250df", "#bc4c00", "#0598bc", "#bf3989", "#6e7781",
  "#9a6700", "#4d2d8c", "#116329", "#a40e26", "#0550ae", "#953800", "#57606a", "#ff8182",
];

export const $ = (id) => document.getElementById(id);
const SVG_NS = $("arrows").namespaceURI; // the namespace of the page's own <svg>: no URL written here

// ---- numbers, colours and elements -------------------------------------------------

export function format(value) {
  // "-inf", "inf" and "nan" arrive as strings (JSON has no such numbers).
  if (typeof value !== "number") return String(value);
  const size = Math.abs(value);
  if (size >= SCIENTIFIC_FROM || (size > 0 && size < SCIENTIFIC_BELOW)) return value.toExponential(PRECISION);
  const text = value.toFixed(PRECISION);
  return /^-[0.]*$/.test(text) ? text.slice(1) : text; // no "-0.0000", as explain writes it
}

export function el(tag, attributes, text) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value !== null && value !== undefined) element.setAttribute(name, String(value));
  }
  if (text !== undefined && text !== null) element.textContent = String(text);
  return element;
}

export function svg(tag, attributes, text) {
  const element = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes || {})) element.setAttribute(name, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

// A table: one header row of ``headCells``, then ``bodyRows`` (<tr> elements) in its body.
export function tableOf(headCells, bodyRows, attributes) {
  const headRow = el("tr");
  headRow.append(...headCells);
  const head = el("thead");
  head.append(headRow);
  const body = el("tbody");
  body.append(...bodyRows);
  const table = el("table", attributes);
  table.append(head, body);
  return table;
}

export function clamp(value, low, high) {
  return Math.min(Math.max(value, low), high);
}

// How dark a weight is drawn: the square root, so that weights of 0.01 still show.
export function shade(weight) {
  return typeof weight === "number" && weight > 0 ? Math.sqrt(Math.min(1, weight)) : 0;
}

export function colourRGB(weight) {
  const t = shade(weight);
  return DARKEST.map((c) => Math.round(255 + (c - 255) * t));
}

export function colour(weight) {
  const [r, g, b] = colourRGB(weight);
  return `rgb(${r}, ${g}, ${b})`;
}

export function quoted(token) {
  return JSON.stringify(String(token));
}

// [4, 5] -> "4–5"; [1, 3] -> "1, 3"
export function spanText(list) {
  if (list.length === 1) return String(list[0]);
  const contiguous = list.every((value, k) => k === 0 || value === list[k - 1] + 1);
  return contiguous ? `${list[0]}–${list[list.length - 1]}` : list.join(", ");
}

// A canvas of ``width`` x ``height`` CSS pixels, drawn at the screen's density (at most 2),
// which it returns.
export function sizeCanvas(canvas, width, height) {
  const scale = Math.min(2, window.devicePixelRatio || 1);
  canvas.width = Math.round(width * scale);
  canvas.height = Math.round(height * scale);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  return scale;
}

// ---- the explorer's frames ---------------------------------------------------------

export function explorerUrl(fields) {
  return "/explorer?" + new URLSearchParams(fields).toString();
}

export function openFrame(boxId, frameId, url) {
  $(frameId).src = url;
  $(boxId).hidden = false;
  $(boxId).scrollIntoView({ block: "nearest" });
}

export function closeFrame(boxId, frameId) {
  $(boxId).hidden = true;
  $(frameId).removeAttribute("src");
}

// ---- requests ----------------------------------------------------------------------

export class ApiError extends Error {}

export function errorOf(text, status) {
  try {
    const data = JSON.parse(text);
    if (data && (data.error || data.detail)) return new ApiError(String(data.error || data.detail));
  } catch (_) {
    // not JSON: fall through to the text itself
  }
  return new ApiError(`the server answered ${status}: ${String(text).slice(0, 300)}`);
}

// A 503 means the model's queue is full: the request is sent again after the server's
// Retry-After, up to BUSY_TRIES times in all and BUSY_WAIT_S seconds of waiting; then the
// 503's own message shows.
const BUSY_TRIES = 4;
const BUSY_WAIT_S = 60;

function pause(seconds, signal) {
  return new Promise((resolve, reject) => {
    if (signal && signal.aborted) return reject(new DOMException("aborted", "AbortError"));
    const timer = setTimeout(resolve, seconds * 1000);
    if (signal) {
      signal.addEventListener("abort", () => {
        clearTimeout(timer);
        reject(new DOMException("aborted", "AbortError"));
      }, { once: true });
    }
  });
}

async function fetchOnce(path, options) {
  try {
    return await fetch(path, options);
  } catch (error) {
    if (error && error.name === "AbortError") throw error;
    throw new ApiError("the server did not answer (is selfattn serve still running?)");
  }
}

export async function reach(path, options) {
  let waited = 0;
  for (let tries = 1; ; tries++) {
    const response = await fetchOnce(path, options);
    const wait = Number(response.headers.get("Retry-After"));
    if (response.status !== 503 || tries >= BUSY_TRIES || !(wait >= 0) || waited + wait > BUSY_WAIT_S) {
      return response;
    }
    await response.text(); // this answer is done with: its connection is free again
    $("status").textContent = `the server is busy: asking again in ${wait} s…`;
    await pause(wait, options && options.signal);
    $("status").textContent = "working…";
    waited += wait;
  }
}

export async function api(path, body, signal) {
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

// A new request of ``state`` (an object with a ``seq`` counter): a function that stays true
// until the next one starts, after which this one's answer is stale.
export function newRequest(state) {
  const seq = ++state.seq;
  return () => seq === state.seq;
}

// ---- busy state, buttons and the message line --------------------------------------

let pending = 0;
const busy = { walk: 0, attention: 0, generate: 0, models: 0 };
const SECTION_NAMES = {
  walk: "The seed's walkthrough",
  attention: "A model's attention",
  generate: "Generation",
  models: "Models",
};
let messageFrom = null;
const buttonRefreshers = [];

export function isBusy(section) {
  return busy[section] > 0;
}

// ``refreshers`` each enable or disable one section's buttons; refreshButtons runs them all.
export function onRefreshButtons(...refreshers) {
  buttonRefreshers.push(...refreshers);
}

export function refreshButtons() {
  for (const refresh of buttonRefreshers) refresh();
}

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

export function clearError(section) {
  if (messageFrom !== section) return;
  const box = $("message");
  box.hidden = true;
  box.textContent = "";
  delete box.dataset.section;
  messageFrom = null;
}

// Run ``work`` as one request of ``section``: its buttons wait, "working…" shows, and a
// failure becomes the message line (unless a newer request made this one stale).
export async function task(section, work, current) {
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
export function debounced(section, fn, ms) {
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
