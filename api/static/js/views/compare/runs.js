// The runs of a comparison: each a job and its metrics points. The history is read downsampled on
// the server (max_points); a live run is then polled for its new points. Polling, not the SSE stream
// the job page follows: eight streams would take more connections than a browser opens to one
// server over HTTP/1.1 (six), starving the page's other requests.

import { api, query } from "../../api.js";

export const MAX_RUNS = 8;
const HISTORY_POINTS = 1000; // per run, as the server downsamples them
const MAX_KEPT = 4 * HISTORY_POINTS; // more, after long polling: read the history again, downsampled
const POLL_PAGES = 5; // per poll and run, of 1000 points each

// One colour per run, in order: style.css's --run-0 … --run-7 (lighter in dark mode); these when unset.
const COLORS = ["#2563eb", "#ea580c", "#059669", "#db2777", "#7c3aed", "#0891b2", "#ca8a04", "#dc2626"];

/** The colour of the index-th run as the page's colour scheme has it now (a canvas needs a value, not a var()). */
export function runColor(index) {
  const css = getComputedStyle(document.documentElement).getPropertyValue(`--run-${index % COLORS.length}`).trim();
  return css || COLORS[index % COLORS.length];
}

/** The route that compares these jobs. */
export const compareHash = (ids) => `#/compare?jobs=${ids.map(encodeURIComponent).join(",")}`;

/** The job ids of `#/compare?jobs=a,b`: trimmed, without repeats, at most MAX_RUNS (and how many were given). */
export function parseJobIds(text) {
  const ids = [...new Set(String(text || "").split(",").map((s) => s.trim()).filter(Boolean))];
  return { ids: ids.slice(0, MAX_RUNS), given: ids.length };
}

export class Run {
  job = null; // the job object, once read
  decided = {}; // what its worker decided for the settings left auto (its start event), once it started
  points = []; // metrics points in step order
  error = null; // why the run could not be read

  constructor(id, index) {
    this.id = id;
    this.index = index;
    this.cssColor = `var(--run-${index % COLORS.length}, ${COLORS[index % COLORS.length]})`; // for swatches
    this.label = id;
  }

  get lastStep() { return this.points.length ? this.points[this.points.length - 1].step : -1; }

  /** Points in step order from a later read: they replace the points from their first step on
   *  (the last point may have gained its val_loss; a resumed job repeats steps). */
  merge(points) {
    if (!points.length) return;
    const from = points[0].step;
    let i = this.points.length;
    while (i > 0 && this.points[i - 1].step >= from) i -= 1;
    this.points.length = i;
    this.points.push(...points);
  }
}

/** "suffix · a1b2c3" (or the model), unique among the runs: more of the id where two would read the same. */
export function labelRuns(runs) {
  for (let tail = 6; tail <= 24; tail += 6) {
    for (const r of runs) {
      const name = r.job ? r.job.suffix || r.job.model || "" : "";
      r.label = name ? `${name} · ${r.id.slice(-tail)}` : r.id;
    }
    if (new Set(runs.map((r) => r.label)).size === runs.length) return;
  }
}

const jobPath = (id) => `/fine_tuning/jobs/${encodeURIComponent(id)}`;

/** {setting: value} a run's start event says its worker decided for settings left auto: the dtype,
 *  compile and each "Hyperparameter <name> <value>: <reason>" (trainer data-aware rules). Events
 *  newest first: a resumed run's latest start. */
export function decidedSettings(events) {
  const start = events.find((e) => e.data && Array.isArray(e.data.auto) && typeof e.data.dtype === "string");
  if (!start) return {};
  const out = { dtype: start.data.dtype, compile: Boolean(start.data.compile) };
  for (const line of start.data.auto) {
    const m = /^(\w+) ([^:]+):/.exec(String(line));
    if (m) out[m[1]] = m[2];
  }
  return out;
}

async function readDecided(run, signal) {
  if (!run.job || !run.job.started_at || Object.keys(run.decided).length) return;
  const page = await api(`${jobPath(run.id)}/events${query({ type: "message", limit: 100 })}`, { signal });
  run.decided = decidedSettings(page.data || []);
}

/** The job, then its metrics history (downsampled); sets run.error instead of throwing. */
export async function loadRun(run, signal) {
  try {
    run.job = await api(jobPath(run.id), { signal });
    await readDecided(run, signal);
    const page = await api(`${jobPath(run.id)}/metrics${query({ max_points: HISTORY_POINTS })}`, { signal });
    run.points = page.data || [];
    run.error = null;
  } catch (e) {
    if (e.name === "AbortError") throw e;
    run.error = e.status === 404 ? "no such job (or it belongs to another key)" : e.message;
  }
}

/** A live run's new state: the job first (so a final status means its last points are readable),
 *  then the points from the last one read on (it may have changed since). */
export async function pollRun(run, signal) {
  run.job = await api(jobPath(run.id), { signal });
  await readDecided(run, signal);
  for (let pages = 0; pages < POLL_PAGES; pages++) {
    const last = run.lastStep;
    const page = await api(`${jobPath(run.id)}/metrics${query({ after_step: last >= 1 ? last - 1 : undefined, limit: 1000 })}`,
      { signal });
    run.merge(page.data || []);
    if (!page.has_more) break;
  }
  if (run.points.length > MAX_KEPT) await loadRun(run, signal);
}
