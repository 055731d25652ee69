// The job page's API calls in one place, so each concern asks for "the job" or "its metrics" and
// none of them spells a URL.

import { api, query } from "../../api.js";

export const HISTORY_POINTS = 1000; // the history is downsampled to this many points on the server

export function jobEndpoints(id, signal) {
  const base = `/fine_tuning/jobs/${encodeURIComponent(id)}`;
  return {
    job: () => api(base, { signal }),
    /** One page of metrics: {max_points} for the history, {after_step, limit} to catch up. */
    metrics: (params) => api(`${base}/metrics${query(params)}`, { signal }),
    checkpoints: () => api(`${base}/checkpoints${query({ limit: 100 })}`, { signal }),
    /** The lifecycle events (status, checkpoints, evaluations, warnings), newest first: the
     *  per-step metrics events are left out (the charts show them). */
    events: () => api(`${base}/events${query({ limit: 100, type: "message" })}`, { signal }),
    file: (fileId) => api(`/files/${encodeURIComponent(fileId)}`, { signal }),
    /** A trained model (GET /v1/models/{id}: a 404 once it is deleted), and its deletion. */
    model: (modelId) => api(`/models/${encodeURIComponent(modelId)}`, { signal }),
    deleteModel: (modelId) => api(`/models/${encodeURIComponent(modelId)}`, { method: "DELETE", signal }),
    /** POST cancel | pause | resume; answers the job. */
    control: (action) => api(`${base}/${action}`, { method: "POST", signal }),
  };
}
