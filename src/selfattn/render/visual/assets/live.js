// The live app's page script (selfattn serve), its entry: it wires the parts together, the
// tabs and the model bar, and starts the page. It asks its own server for every number (the
// JSON API in selfattn/serve/app.py) and computes no attention itself. The parts:
//   live-common.js          DOM helpers, number format, requests, busy state, the message line
//   live-models.js          the model list and the picked model's facts, layers and heads
//   live-walk.js            tab 1, the seed's walkthrough
//   live-attention.js       tab 2, a model's attention (with live-attention-grid.js, live-arrows.js)
//   live-generate.js        tab 3, generation (with live-tokens.js, live-cache.js)
//   live-ablate.js          tab 3, knocked-out heads, before and after
//   live-chat.js            tab 3, chat mode: the conversation, sent as messages

import { $, onRefreshButtons, refreshButtons, task } from "./live-common.js";
import { currentModel, fillLayerHead, loadModels, renderModelFacts } from "./live-models.js";
import { fillWalkOptions, setUpWalk, walkRequest } from "./live-walk.js";
import { refreshAttentionButtons, resetAttention, setUpAttention } from "./live-attention.js";
import {
  onAblationChange, refreshGenerationButtons, renderGeneration, resetGeneration, setUpGeneration,
} from "./live-generate.js";
import { buildAblationGrid, refreshAblationButtons, setUpAblation } from "./live-ablate.js";

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

// Another model: its facts, layers and heads; the attention and the generation start afresh.
function onModelChange() {
  const model = currentModel();
  renderModelFacts(model);
  fillLayerHead(model);
  resetAttention();
  resetGeneration();
  buildAblationGrid(model);
  refreshButtons();
}

onRefreshButtons(refreshAttentionButtons, refreshGenerationButtons, refreshAblationButtons);
setUpTabs();
setUpWalk();
setUpAttention();
setUpGeneration();
setUpAblation(onAblationChange);
$("model-select").addEventListener("change", onModelChange);
renderGeneration();
task("walk", fillWalkOptions).then(() => walkRequest(null));
loadModels(onModelChange);
