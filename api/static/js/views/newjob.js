// New job: upload (or pick) a training file, choose a preset and hyperparameters, create the job.
// The hyperparameter fields, their defaults and the presets come from the API's schema
// (GET /v1/fine_tuning/hyperparameters, fetched once and cached); only the fields changed from
// their defaults are sent. An API validation error is shown next to the field `error.param` names.
//   newjob/files.js (data)   newjob/fields.js + schema.js (hyperparameters)   newjob/errors.js
//   newjob/integrations.js (W&B and MLflow)   newjob/metadata.js (key/value rows)
//   newjob/estimate.js (the live estimate beside the form, the server's admission arithmetic)

import { ApiError, api } from "../api.js";
import { loadHyperparameterSchema } from "../served.js";
import { el, toast } from "../util.js";
import { FieldErrors } from "./newjob/errors.js";
import { fieldId, hyperparameterFields } from "./newjob/fields.js";
import { estimatePanel } from "./newjob/estimate.js";
import { dataFieldset } from "./newjob/files.js";
import { integrationsSection } from "./newjob/integrations.js";
import { metadataSection } from "./newjob/metadata.js";
import { defaultPreset, presetNames } from "./newjob/schema.js";

export function mountNewJob(root) {
  const abort = new AbortController();
  const loading = el("p", { class: "muted", role: "status" }, "Loading the hyperparameters…");
  root.append(loading);
  loadHyperparameterSchema().then((schema) => {
    if (abort.signal.aborted) return;
    loading.remove();
    root.append(newJobPage(schema, abort.signal));
  }, (e) => {
    if (abort.signal.aborted) return;
    loading.className = "error-banner";
    loading.textContent = `Could not read the hyperparameters from the API: ${e.message}`;
  });
  return { destroy() { abort.abort(); } };
}

const labelled = (id, text, name) => el("label", { for: id }, text, el("span", { class: "param-name" }, name));

/** A number where one was typed, the text otherwise (the API says what is wrong with it). */
function typedNumber(text) {
  const n = Number(text);
  return Number.isFinite(n) ? n : text;
}

/** The form, with the live estimate beside it (asked again on every edit). */
function newJobPage(schema, signal) {
  let requestBody = () => null;
  const estimate = estimatePanel({ body: () => requestBody(), signal });
  const form = newJobForm(schema, signal, estimate);
  requestBody = form.requestBody;
  for (const type of ["input", "change"]) form.node.addEventListener(type, () => estimate.update());
  return el("div", { class: "new-job-layout" }, form.node, estimate.node);
}

function newJobForm(schema, signal, estimate) {
  const errors = new FieldErrors();
  const data = dataFieldset({ errors, signal, onLoaded: () => estimate.update() });
  const hyperparameters = hyperparameterFields({ schema, errors });
  const integrations = integrationsSection({ errors });
  const request = requestFields({ schema, errors, hyperparameters });
  const metadata = metadataSection({ errors });

  const submit = el("button", { type: "submit", class: "primary" }, "Start training");
  const form = el("form", { class: "card new-job", novalidate: true },
    el("h1", {}, "New training job"),
    errors.banner,
    data.node,
    request.node,
    hyperparameters.architecture, hyperparameters.training, hyperparameters.advanced, metadata.node, integrations.node,
    el("div", { class: "actions" }, submit, el("a", { href: "#/jobs", class: "button secondary" }, "Cancel")));

  /** The request: only what the user chose; everything left alone gets the server's default. */
  function requestBody() {
    const body = { model: request.preset.value, training_file: data.trainingFile() };
    if (data.validationFile()) body.validation_file = data.validationFile();
    Object.assign(body, request.chosen());
    const changed = hyperparameters.changed();
    if (Object.keys(changed).length) body.hyperparameters = changed;
    const chosen = integrations.body();
    if (chosen) body.integrations = chosen;
    const labels = metadata.body();
    if (labels) body.metadata = labels;
    return body;
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    errors.clear();
    if (!data.trainingFile()) {
      errors.show("training_file", "Upload a file or choose one you uploaded before.");
      return;
    }
    submit.disabled = true;
    submit.textContent = "Starting…";
    try {
      const job = await api("/fine_tuning/jobs", { method: "POST", body: requestBody() });
      toast(`Job ${job.id} created`);
      location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
    } catch (e) {
      if (e instanceof ApiError && e.status !== 401) errors.show(integrations.slotFor(e.param) ?? e.param, e.message);
      else if (!(e instanceof ApiError)) errors.show(null, e.message);
    } finally {
      submit.disabled = false;
      submit.textContent = "Start training";
    }
  });

  data.load();
  return { node: form, requestBody: () => (data.trainingFile() ? requestBody() : null) };
}

/** The request's own fields: model (the preset) and suffix in the Model fieldset (node), and the
 *  seed among the training hyperparameters. chosen(): the suffix and seed, when given. */
function requestFields({ schema, errors, hyperparameters }) {
  const preset = el("select", { id: "model", name: "model", "aria-describedby": "err-model" },
    presetNames(schema).map((name) => el("option", { value: name }, name)));
  preset.value = defaultPreset(schema);
  preset.addEventListener("change", () => hyperparameters.setPreset(preset.value));
  const suffix = el("input", { id: "suffix", name: "suffix", type: "text", maxlength: 40, placeholder: "optional",
    "aria-describedby": "err-suffix" });
  const seed = el("input", { id: fieldId("seed"), name: "seed", type: "text", inputmode: "numeric",
    autocomplete: "off", spellcheck: "false", placeholder: "random", "aria-describedby": "err-seed" });
  hyperparameters.training.append(el("div", { class: "field", dataset: { field: "seed" },
    title: "The job's random seed; left empty, the server picks one (shown on the job)." },
  labelled(seed.id, "Seed", "seed"), seed, errors.slot("seed", seed)));
  const node = el("fieldset", { class: "grid" },
    el("legend", {}, "Model"),
    el("div", { class: "field" }, labelled("model", "Preset", "model"), preset, errors.slot("model", preset)),
    el("div", { class: "field" }, labelled("suffix", "Model name suffix", "suffix"), suffix, errors.slot("suffix", suffix)));
  function chosen() {
    const out = {};
    if (suffix.value.trim()) out.suffix = suffix.value.trim();
    if (seed.value.trim()) out.seed = typedNumber(seed.value.trim());
    return out;
  }
  return { node, preset, chosen };
}
