// Tab 3, generation step by step (/api/generate): +1 token (asking only for the new step),
// or a streamed run of up to max tokens (one NDJSON line per step, drawn as it arrives), with
// the sampling options; with heads knocked out the same generation without them comes too.
// It keeps the generation's state and draws it through live-tokens.js, live-cache.js and
// live-ablate.js; in chat mode the body carries the conversation (live-chat.js) instead of a prompt.

import { $, ApiError, api, clearError, errorOf, isBusy, newRequest, reach, refreshButtons, task } from "./live-common.js";
import { currentModel, decoderPicked, markLoaded } from "./live-models.js";
import { renderProbs, renderStepNav, renderTokens, setUpSteps, viewedStep } from "./live-tokens.js";
import { drawStrips, renderCache, setUpCache } from "./live-cache.js";
import { checkedHeads, renderCompare } from "./live-ablate.js";
import { beginExchange, chatMessages, chatOn, renderChat, resetChat } from "./live-chat.js";

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
  frame: 0,
};

// The run shown: ``fields`` over an empty one (no step, nothing knocked out, the latest step looked at).
function setRun(fields) {
  Object.assign(gen, { start: null, steps: [], pending: [], done: null, baseline: null, knocked: [], view: null }, fields);
}

export function refreshGenerationButtons() {
  const decoder = decoderPicked();
  for (const id of ["generate-step", "generate-run"]) $(id).disabled = isBusy("generate") || !decoder;
  $("generate-reset").disabled = !decoder;
}

export function resetGeneration() {
  if (gen.controller) gen.controller.abort();
  gen.controller = null;
  gen.seq += 1;
  setRun({ key: null });
  resetChat();
  renderGeneration();
}

function numberField(id) {
  const raw = $(id).value.trim();
  if (raw === "") return null;
  const value = Number(raw);
  return Number.isNaN(value) ? raw : value;
}

function generateBody(count, ablate) {
  const model = currentModel();
  const seed = numberField("seed");
  return {
    model: model ? model.name : null,
    ...(chatOn() ? { messages: chatMessages() } : { text: $("prompt-input").value }),
    max_new_tokens: count,
    temperature: numberField("temperature") ?? 0,
    top_k: numberField("top-k"),
    top_p: numberField("top-p"),
    seed: seed === null ? 0 : seed,
    ablate,
    // The strips draw every layer and head of the step looked at, and any step can be looked at.
    layers: "all",
    heads: "all",
  };
}

// Generate ``count`` tokens from the prompt: in one answer (``streamed`` false) or one NDJSON
// line per step, each drawn as it arrives. With heads knocked out, the same generation
// without them comes too (the "before").
function generate(count, streamed) {
  const model = currentModel();
  if (!decoderPicked()) return Promise.resolve();
  if (gen.controller) gen.controller.abort();
  const controller = new AbortController();
  gen.controller = controller;
  const current = newRequest(gen);
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
    // The generation without the knock-out shows its tokens and probabilities only: no attention asked.
    const baseline = knocked.length
      ? api("/api/generate", { ...generateBody(count, []), first_step: first, layers: [] }, controller.signal)
      : Promise.resolve(null);
    if (streamed) {
      setRun({ prompt: body.text ?? "", knocked });
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
      setRun({
        prompt: body.text ?? "",
        start: result,
        steps: extend ? gen.steps.concat(result.steps) : result.steps,
        done: result,
        baseline: before && extend ? { ...before, steps: gen.baseline.steps.concat(before.steps) } : before,
        knocked,
      });
    }
    gen.key = key;
    markLoaded(model);
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

export function renderGeneration() {
  if (gen.frame) {
    cancelAnimationFrame(gen.frame);
    gen.frame = 0;
  }
  const model = currentModel();
  const notice = $("generate-disabled");
  if (model && model.kind !== "decoder") {
    notice.textContent = `${model.name} is an encoder: it reads the whole text at once, in both directions, and has ` +
      "no next-token head, so it cannot write a next token. Pick a decoder (tiny-induction, stories260K, " +
      "SmolLM2-135M-Instruct) in the model list to generate.";
    notice.hidden = false;
  } else {
    notice.hidden = true;
  }
  const t = viewedStep(gen);
  renderTokens(gen, t);
  renderStepNav(gen, t);
  renderProbs(gen, t);
  drawStrips(gen, t);
  renderCache(gen, t);
  renderCompare(gen);
  renderChat(gen);
  refreshButtons();
}

// Ticked or unticked heads: generate the steps shown again (before and after).
export function onAblationChange() {
  if (gen.steps.length) generate(gen.steps.length, false);
  else renderGeneration();
}

function onOptionsChange() {
  if (gen.steps.length) generate(gen.steps.length, false);
}

// A button pressed: in chat mode the message in the box is asked (a new one starts an exchange).
function ask(count, streamed) {
  if (chatOn()) beginExchange($("prompt-input").value, gen.done);
  return generate(count, streamed);
}

export function setUpGeneration() {
  $("generate-step").addEventListener("click", () => ask(gen.steps.length + 1, false));
  $("generate-run").addEventListener("click", () => {
    const count = numberField("generate-count");
    ask(count === null ? null : count, true);
  });
  $("generate-reset").addEventListener("click", () => {
    resetGeneration();
    clearError("generate");
  });
  // A prompt typed anew starts afresh; a message typed in chat mode waits for its button.
  $("prompt-input").addEventListener("input", () => {
    if (!chatOn()) resetGeneration();
  });
  $("chat-mode").addEventListener("change", () => {
    // An answer is longer than the few tokens a prompt is stepped by: the page's 8 becomes 48.
    if ($("chat-mode").checked && $("generate-count").value === "8") $("generate-count").value = "48";
    resetGeneration();
    clearError("generate");
  });
  $("temperature-slider").addEventListener("input", () => {
    $("temperature").value = $("temperature-slider").value;
  });
  $("temperature").addEventListener("input", () => {
    const value = Number($("temperature").value);
    if (!Number.isNaN(value)) $("temperature-slider").value = String(Math.min(2, value));
  });
  for (const id of ["temperature-slider", "temperature", "top-k", "top-p", "seed", "system-input"]) {
    $(id).addEventListener("change", onOptionsChange);
  }
  setUpSteps(gen, renderGeneration);
  setUpCache(gen, renderGeneration);
}
