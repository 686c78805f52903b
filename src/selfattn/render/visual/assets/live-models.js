// The model bar: the models the server offers (/api/models), the one picked, its facts, and
// the layer and head lists that follow it (the attention tab's and the cache's).

import { $, api, clearError, el, task } from "./live-common.js";

const models = { list: [], byName: new Map() };

export function currentModel() {
  return models.byName.get($("model-select").value) || null;
}

// Whether the picked model writes text (a decoder); an encoder cannot generate.
export function decoderPicked() {
  const model = currentModel();
  return Boolean(model && model.kind === "decoder");
}

// Ask for the models, fill the list (stories260K first when offered), then ``onModelChange``.
export function loadModels(onModelChange) {
  return task("models", async () => {
    const data = await api("/api/models");
    models.list = data.models || [];
    models.byName = new Map(models.list.filter((m) => !m.error).map((m) => [m.name, m]));
    const select = $("model-select");
    select.replaceChildren(
      ...models.list.map((m) => {
        if (m.error) return el("option", { value: m.name, disabled: "" }, `${m.name}: unavailable (${m.error})`);
        const shape = `${m.layers} layers × ${m.heads} heads`;
        return el("option", { value: m.name }, `${m.name} (${m.kind}, ${shape})`);
      })
    );
    const usable = models.list.filter((m) => !m.error);
    const preferred = usable.find((m) => m.name === "stories260K") || usable[0];
    if (preferred) select.value = preferred.name;
    clearError("models");
    onModelChange();
  });
}

export function renderModelFacts(model) {
  const facts = $("model-facts");
  if (!model) {
    facts.textContent = "no model available";
  } else {
    const parts = [`${model.kind}: ${model.layers} layers × ${model.heads} heads`];
    if (model.kv_heads < model.heads) parts.push(`${model.kv_heads} key/value heads (grouped-query attention)`);
    parts.push(`${model.positions} positions`);
    facts.textContent = parts.join(", ") + (model.loaded ? "" : " · loads when first used");
  }
}

// The server has now loaded ``model``: its facts no longer say "loads when first used".
export function markLoaded(model) {
  model.loaded = true;
  renderModelFacts(currentModel());
}

function fillOptions(select, entries, keep) {
  select.replaceChildren(...entries.map(([value, label]) => el("option", { value }, label)));
  if (entries.some(([value]) => value === keep)) select.value = keep;
}

export function fillLayerHead(model) {
  const layers = model ? model.layers : 0;
  const heads = model ? model.heads : 0;
  const layerEntries = Array.from({ length: layers }, (_, l) => [String(l), `layer ${l}`]);
  const headEntries = Array.from({ length: heads }, (_, h) => [String(h), `head ${h}`]);
  fillOptions($("layer-select"), layerEntries, $("layer-select").value);
  fillOptions($("head-select"), [...headEntries, ["all", "all heads"]], $("head-select").value);
  fillOptions($("cache-layer"), layerEntries, $("cache-layer").value);
  fillOptions($("cache-head"), headEntries, $("cache-head").value);
}
