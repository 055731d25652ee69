// The playground's model picker (GET /v1/models: fine-tuned models and checkpoints, newest first;
// the base models it also lists have no weights to sample) and the link other pages use to open
// the playground with a model chosen.

import { api } from "../../api.js";
import { clear, el } from "../../util.js";

/** The playground's address with `modelId` preselected. */
export function playgroundHref(modelId) {
  return modelId ? `#/playground?model=${encodeURIComponent(modelId)}` : "#/playground";
}

/** A "Try it" link that follows a model <select> (the job page's). Call update() after refills. */
export function tryItLink(select, text = "Try it in the playground") {
  const link = el("a", { class: "button secondary", href: playgroundHref("") }, text);
  const update = () => {
    link.href = playgroundHref(select.value);
    link.hidden = !select.value;
  };
  select.addEventListener("change", update);
  update();
  return { node: link, update };
}

function option(m) {
  const where = m.kind === "checkpoint" ? `step ${m.step ?? "?"}` : "final";
  return el("option", { value: m.id }, `${m.id} (${where})`);
}

/**
 * The <select id="pg-model">: "Models" then "Checkpoints" groups. `preselect` (from the address) is
 * chosen, and offered even when the list lacks it (the API answers if it names nothing of yours).
 */
export function modelPicker({ preselect, signal, onChange }) {
  const select = el("select", { id: "pg-model", name: "model", disabled: true },
    el("option", { value: "" }, "Loading your models…"));
  select.addEventListener("change", () => onChange(select.value));

  async function load() {
    const { data } = await api("/models", { signal });
    const models = (data || []).filter((m) => m.kind !== "base"); // presets: nothing to sample
    const finals = models.filter((m) => m.kind !== "checkpoint");
    const checkpoints = models.filter((m) => m.kind === "checkpoint");
    const groups = [];
    if (preselect && !models.some((m) => m.id === preselect)) {
      groups.push(el("option", { value: preselect }, `${preselect} (not in your model list)`));
    }
    if (finals.length) groups.push(el("optgroup", { label: "Models" }, finals.map(option)));
    if (checkpoints.length) groups.push(el("optgroup", { label: "Checkpoints" }, checkpoints.map(option)));
    if (!groups.length) groups.push(el("option", { value: "" }, "No models yet"));
    clear(select, groups);
    if (preselect) select.value = preselect;
    select.disabled = !select.value;
    onChange(select.value);
    return models.length;
  }

  return { node: select, load };
}
