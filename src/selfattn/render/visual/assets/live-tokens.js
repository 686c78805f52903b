// Tab 3's token flow and step: the prompt and the new tokens (those a stream has chosen but
// not yet sent the numbers of, too), the step slider, and the next-token probabilities of
// the step looked at (with heads knocked out, the list without them beside it). ``gen`` is
// the generation's state (live-generate.js); gen.view is the step looked at, null: the latest.

import { $, clamp, el, format, quoted } from "./live-common.js";

// The step looked at (an index into gen.steps), or null before the first step.
export function viewedStep(gen) {
  if (!gen.steps.length) return null;
  return gen.view === null ? gen.steps.length - 1 : clamp(gen.view, 0, gen.steps.length - 1);
}

export function renderTokens(gen, t) {
  const box = $("tokens");
  // The box holds tokens only (one child each); before the first step a hint stands beside it.
  $("tokens-hint").hidden = Boolean(gen.start);
  box.hidden = !gen.start;
  if (!gen.start) {
    box.replaceChildren();
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

export function renderStepNav(gen, t) {
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

export function renderProbs(gen, t) {
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

// The step slider and the new tokens (click, Enter or space) pick the step looked at; then
// ``rerender`` shows it.
export function setUpSteps(gen, rerender) {
  const lookAt = (s) => {
    gen.view = s >= gen.steps.length - 1 ? null : s;
    rerender();
  };
  $("step-slider").addEventListener("input", () => lookAt(Number($("step-slider").value)));
  const pickToken = (event) => {
    const token = event.target.closest(".tok.generated");
    if (token) lookAt(Number(token.dataset.step));
  };
  $("tokens").addEventListener("click", pickToken);
  $("tokens").addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      pickToken(event);
    }
  });
}
