// Tab 3's chat mode, for models tuned for chat (/api/models says "chat": true): the
// conversation so far and the message being answered. The answer is generated and drawn as
// any generation is (live-generate.js) from a body with ``messages`` instead of ``text``; the
// server lays them out with the model's own chat template, so the token flow and every
// head's attention strip cover the whole conversation the model reads, turn markers included.
//
// An exchange (a message and its answer) joins the conversation when the next message is
// sent: until then ticking heads, changing the sampling or stepping on (+1 token) works on
// the exchange shown, as it does on a prompt.

import { $, el } from "./live-common.js";
import { currentModel } from "./live-models.js";

const chat = {
  history: [], // the turns before the exchange shown: {role, content}
  asked: null, // the user's message of the exchange shown
};

// Whether the page is in chat mode (ticked, and the model has a chat template).
export function chatOn() {
  const model = currentModel();
  return $("chat-mode").checked && Boolean(model && model.chat);
}

// A new conversation: no turns, nothing asked.
export function resetChat() {
  chat.history = [];
  chat.asked = null;
}

// Before a request for ``message``: a different message than the one shown starts a new
// exchange, and the one shown (answered in ``done``) joins the conversation.
export function beginExchange(message, done) {
  if (chat.asked !== null && message !== chat.asked) {
    if (done) chat.history.push({ role: "user", content: chat.asked }, { role: "assistant", content: done.text });
    chat.asked = null;
  }
  if (chat.asked === null) chat.asked = message;
}

// The request's ``messages``: the system text (when given), the turns so far, the message asked.
export function chatMessages() {
  const system = $("system-input").value.trim();
  return [
    ...(system ? [{ role: "system", content: system }] : []),
    ...chat.history,
    { role: "user", content: chat.asked ?? $("prompt-input").value },
  ];
}

// The controls follow the mode; the conversation shows each turn and the answer being written.
export function renderChat(gen) {
  const model = currentModel();
  const offered = Boolean(model && model.kind === "decoder" && model.chat);
  const box = $("chat-mode");
  box.disabled = !offered;
  if (!offered) box.checked = false;
  const on = chatOn();
  $("system-label").hidden = !on;
  $("prompt-label").textContent = on ? "Message" : "Prompt";
  $("generate-run").textContent = on ? "Send (answer streamed)" : "Generate max (streamed)";
  $("chat-note").textContent = offered
    ? (on ? "The model reads the whole conversation, laid out by its own chat template; the answer stops at its " +
      "end of turn." : "")
    : "Chat needs a model tuned for chat (one with a chat template, such as SmolLM2-135M-Instruct).";
  const list = $("conversation");
  list.hidden = !on || (chat.asked === null && !chat.history.length);
  if (list.hidden) return;
  const turns = [...chat.history];
  if (chat.asked !== null) turns.push({ role: "user", content: chat.asked });
  const items = turns.map((turn) => turnItem(turn.role, turn.content, turn.role));
  // The answer of the exchange shown: whole when done, else the text of the tokens chosen so far.
  const chosen = gen.pending || [];
  if (chat.asked !== null && (gen.done || chosen.length)) {
    const text = gen.done ? gen.done.text : chosen.map((token) => token.text).join("");
    const item = turnItem("assistant", text || "…", gen.done ? "assistant" : "assistant writing");
    item.dataset.testid = "answer";
    items.push(item);
  }
  list.replaceChildren(...items);
  list.scrollTop = list.scrollHeight;
}

function turnItem(role, content, className) {
  const item = el("li", { class: className });
  item.append(el("span", { class: "role" }, `${role}:`), document.createTextNode(content));
  return item;
}
