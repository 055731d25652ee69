// What the API serves about itself, fetched once per sign-in and cached: the job statuses with their
// sets (GET /v1/fine_tuning/statuses), the hyperparameter schema (GET /v1/fine_tuning/hyperparameters)
// and the download formats (GET /v1/fine_tuning/export_formats). The dashboard keeps no copy of them:
// which statuses are terminal, which fields a job accepts and their defaults, what a model downloads
// as are the server's answer.

import { api } from "./api.js";

const cache = new Map(); // path -> Promise of the parsed answer

/** GET /v1<path> once; a failed request is forgotten so the next call asks again. */
function once(path, parse) {
  if (!cache.has(path)) {
    const pending = api(path).then(parse);
    cache.set(path, pending);
    pending.catch(() => { if (cache.get(path) === pending) cache.delete(path); });
  }
  return cache.get(path);
}

/** Forget everything served (on sign-out or a refused key: the next key asks again). */
export function forgetServed() { cache.clear(); }

/**
 * The statuses as sets: {all: [...in lifecycle order], terminal, claimable, active: Set}.
 * terminal: the job never changes again; claimable: a worker may pick it up; active: a worker holds it.
 */
export function loadStatuses() {
  return once("/fine_tuning/statuses", (body) => Object.freeze({
    all: [...body.statuses],
    terminal: new Set(body.terminal),
    claimable: new Set(body.claimable),
    active: new Set(body.active),
  }));
}

/** The JSON Schema of the hyperparameters a job accepts (shape: docs, /v1/fine_tuning/hyperparameters). */
export function loadHyperparameterSchema() {
  return once("/fine_tuning/hyperparameters", (body) => body);
}

/**
 * What a model downloads as: {formats: [{name, title, description, extension, media_type, dtypes}],
 * dtypes: [{name, description}], default_format, default_dtype, made_at_job_end, job_end_dtype}.
 */
export function loadExportFormats() {
  return once("/fine_tuning/export_formats", (body) => body);
}
