// New job: upload (or pick) a training file, choose a preset and hyperparameters, create the job.
// The hyperparameter fields, their defaults and the presets come from the API's schema
// (GET /v1/fine_tuning/hyperparameters, fetched once and cached); only the fields changed from
// their defaults are sent. An API validation error is shown next to the field `error.param` names.
//   newjob/files.js (data)   newjob/fields.js + schema.js (hyperparameters)   newjob/errors.js
//   newjob/integrations.js (W&B and MLflow)   newjob/metadata.js (key/value rows)
//   newjob/estimate.js (the live estimate beside the form, the server's admission arithmetic)
// #/new?clone=<job id> (the job page's Clone) starts the form from that job: its model, files,
// suffix, seed and hyperparameters (not its metadata or integrations).

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

/** params: the address's query (clone=<job id>). */
export function mountNewJob(root, { params } = {}) {
  const abort = new AbortController();
  const cloneOf = params?.get("clone");
  const loading = el("p", { class: "muted", role: "status" }, "Loading the hyperparameters…");
  root.append(loading);
  const cloned = cloneOf ? jobToClone(cloneOf, abort.signal) : null;
  Promise.all([loadHyperparameterSchema(), cloned]).then(([schema, source]) => {
    if (abort.signal.aborted) return;
    loading.remove();
    root.append(newJobPage(schema, abort.signal, source));
  }, (e) => {
    if (abort.signal.aborted) return;
    loading.className = "error-banner";
    loading.textContent = `Could not read the hyperparameters from the API: ${e.message}`;
  });
  return { destroy() { abort.abort(); } };
}

/** {id, job} of the job to clone, or {id, error} when it cannot be read (the form says why). */
function jobToClone(id, signal) {
  return api(`/fine_tuning/jobs/${encodeURIComponent(id)}`, { signal })
    .then((job) => ({ id, job }), (error) => ({ id, error }));
}

const labelled = (id, text, name) => el("label", { for: id }, text, el("span", { class: "param-name" }, name));

/** A number where one was typed, the text otherwise (the API says what is wrong with it). */
function typedNumber(text) {
  const n = Number(text);
  return Number.isFinite(n) ? n : text;
}

/** The form, with the live estimate beside it (asked again on every edit). */
function newJobPage(schema, signal, source) {
  let requestBody = () => null;
  const estimate = estimatePanel({ body: () => requestBody(), signal });
  const form = newJobForm(schema, signal, estimate, source);
  requestBody = form.requestBody;
  for (const type of ["input", "change"]) form.node.addEventListener(type, () => estimate.update());
  return el("div", { class: "new-job-layout" }, form.node, estimate.node);
}

function newJobForm(schema, signal, estimate, source) {
  const errors = new FieldErrors();
  const data = dataFieldset({ errors, signal, onLoaded: () => estimate.update() });
  const hyperparameters = hyperparameterFields({ schema, errors });
  const integrations = integrationsSection({ errors });
  const request = requestFields({ schema, errors, hyperparameters });
  const metadata = metadataSection({ errors });

  const submit = el("button", { type: "submit", class: "primary" }, "Start training");
  const form = el("form", { class: "card new-job", novalidate: true },
    el("h1", {}, "New training job"),
    source ? cloneNote(source) : null,
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
      if (!(e instanceof ApiError)) errors.show(null, e.message);
      else if (e.status !== 401) errors.showApi(e.param, e.message, (param) => integrations.slotFor(param) ?? param);
    } finally {
      submit.disabled = false;
      submit.textContent = "Start training";
    }
  });

  startFrom(source, { request, hyperparameters, data, errors });
  return { node: form, requestBody: () => (data.trainingFile() ? requestBody() : null) };
}

/** List the files, and fill the form from the job being cloned (source), if any. */
function startFrom(source, { request, hyperparameters, data, errors }) {
  const job = source?.job;
  if (job) {
    request.prefill(job);
    hyperparameters.prefill(job.hyperparameters || {});
  } else if (source) errors.show(null, `Could not read job ${source.id} to clone: ${source.error.message}`);
  data.load(job ? { training_file: job.training_file, validation_file: job.validation_file } : {});
}

function cloneNote({ id }) {
  return el("p", { class: "muted", id: "clone-note" }, "A copy of ",
    el("a", { href: `#/jobs/${encodeURIComponent(id)}`, class: "mono" }, id),
    ": its model, files, seed and hyperparameters. Change what you like and start it.");
}

/** The request's own fields: model (the preset) and suffix in the Model fieldset (node), and the
 *  seed among the training hyperparameters. chosen(): the suffix and seed, when given; prefill(job):
 *  a cloned job's. */
function requestFields({ schema, errors, hyperparameters }) {
  const presets = presetNames(schema);
  const preset = el("select", { id: "model", name: "model", "aria-describedby": "err-model" },
    presets.map((name) => el("option", { value: name }, name)));
  preset.value = defaultPreset(schema);
  const follow = () => {
    hyperparameters.setPreset(preset.value);
    // a model continued from brings its own architecture (the API refuses architecture fields)
    hyperparameters.architecture.hidden = !presets.includes(preset.value);
  };
  preset.addEventListener("change", follow);
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
  /** A cloned job's model (a preset, or the model it continued from), suffix and seed. */
  function prefill(job) {
    if (!presets.includes(job.model)) {
      preset.append(el("option", { value: job.model }, `${job.model} (continue training it)`));
    }
    preset.value = job.model;
    follow();
    suffix.value = job.suffix || "";
    seed.value = job.seed ?? "";
  }
  return { node, preset, chosen, prefill };
}
