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
 * load() may be called again (the page shown again): the list then follows deletions, and the
 * model chosen stays chosen while it is listed (else the newest is). model(id): the listed model.
 */
export function modelPicker({ preselect, signal, onChange }) {
  const select = el("select", { id: "pg-model", name: "model", disabled: true },
    el("option", { value: "" }, "Loading your models…"));
  select.addEventListener("change", () => onChange(select.value));
  let models = [];
  let loaded = false;
  let foreign = null; // the address's model when your list lacked it

  async function load() {
    const { data } = await api("/models", { signal });
    models = (data || []).filter((m) => m.kind !== "base"); // presets: nothing to sample
    const listed = (id) => models.some((m) => m.id === id);
    if (!loaded && preselect && !listed(preselect)) foreign = preselect;
    const keep = loaded ? select.value : preselect;
    loaded = true;
    const finals = models.filter((m) => m.kind !== "checkpoint");
    const checkpoints = models.filter((m) => m.kind === "checkpoint");
    const groups = [];
    if (foreign) groups.push(el("option", { value: foreign }, `${foreign} (not in your model list)`));
    if (finals.length) groups.push(el("optgroup", { label: "Models" }, finals.map(option)));
    if (checkpoints.length) groups.push(el("optgroup", { label: "Checkpoints" }, checkpoints.map(option)));
    if (!groups.length) groups.push(el("option", { value: "" }, "No models yet"));
    clear(select, groups);
    if (keep && (listed(keep) || keep === foreign)) select.value = keep; // else the first: the newest
    select.disabled = !select.value;
    onChange(select.value);
    return models.length;
  }

  return { node: select, load, model: (id) => models.find((m) => m.id === id) };
}
