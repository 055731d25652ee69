// The run at a glance: its files (names, sizes, tokens), model (parameters, size), metadata, timings
// (queued, started, duration, tokens/s) and where it ran (device, precision). What the job object
// does not carry comes from the worker's start event ("Training on ...", its data: n_params, device,
// dtype, train_tokens, ...), which the page reads from the lifecycle events. The duration is the
// time the job ran: the time it spent paused (from the status events) is left out.

import { clear, el, fmtBytes, fmtDuration, fmtInt, fmtTime } from "../../util.js";

const WEIGHT_BYTES = 4; // a parameter in float32, as checkpoints store them

const row = (key, label, value) => [el("dt", {}, label), el("dd", { id: `run-${key}` }, value ?? "—")];

/** The worker's start event among the lifecycle events (newest first): the newest attempt's. */
export const startEvent = (events) => events.find((e) => e.data && typeof e.data.n_params === "number") || null;

function fileText(file, tokens) {
  if (!file) return null;
  const parts = [file.filename || file.id, fmtBytes(file.bytes)];
  if (typeof tokens === "number") parts.push(`${fmtInt(tokens)} tokens`);
  return el("span", {}, parts.join(" · "), el("span", { class: "mono small muted" }, ` ${file.id}`));
}

/** Seconds from `from` to `to` (or now while it runs). */
function span(from, to) {
  if (typeof from !== "number" || from <= 0) return undefined;
  return (typeof to === "number" && to > 0 ? to : Date.now() / 1000) - from;
}

/** Seconds the job stood still for a pause between `from` and `to`: from each status event "paused"
 *  (the lifecycle events' data.status) until it ran again (the next "running" or final status: a
 *  resumed job waits in the queue first), or to `to` while it has not. */
export function pausedSeconds(events, from, to) {
  const changes = events.filter((e) => typeof e.data?.status === "string" && typeof e.created_at === "number")
    .reverse() // oldest first; the sort keeps events of one second in their order
    .sort((a, b) => a.created_at - b.created_at);
  const stillStopped = new Set(["paused", "queued", "validating_files"]);
  const within = (start, end) => Math.max(0, Math.min(end, to) - Math.max(start, from));
  let paused = 0;
  let since = null; // when the pause being counted began
  for (const e of changes) {
    if (e.data.status === "paused" && since === null) since = e.created_at;
    else if (since !== null && !stillStopped.has(e.data.status)) {
      paused += within(since, e.created_at);
      since = null;
    }
  }
  return since === null ? paused : paused + within(since, to);
}

function timings(job, events) {
  const total = span(job.started_at, job.finished_at);
  const paused = total === undefined ? 0 : pausedSeconds(events, job.started_at, job.started_at + total);
  const duration = total === undefined ? undefined : total - paused; // the time it ran
  const waited = span(job.created_at, job.started_at ?? job.finished_at);
  const average = job.trained_tokens && duration ? job.trained_tokens / duration : undefined;
  const tps = job.progress?.tokens_per_s;
  const pausedNote = paused >= 1 ? ` (not counting ${fmtDuration(paused)} stopped by a pause)` : "";
  return [
    row("queued", "Queued", `${fmtTime(job.created_at)}${job.started_at && waited !== undefined ? ` (waited ${fmtDuration(waited)})` : ""}`),
    row("started", "Started", fmtTime(job.started_at)),
    row("finished", "Finished", fmtTime(job.finished_at)),
    row("duration", "Duration", job.started_at ? `${fmtDuration(duration)}${pausedNote}` : "—"),
    row("tokens-per-s", "Tokens/s", average !== undefined ? `${fmtInt(average)} average` : tps ? `${fmtInt(tps)} latest` : "—"),
  ];
}

function device(job, start) {
  const d = start?.data;
  if (!d) return [row("device", "Device", `queue ${job.queue || "—"}`)];
  const where = d.processes > 1 ? `${d.processes} × ${String(d.device).split(":")[0]}` : d.device;
  return [
    row("device", "Device", `${where} (queue ${job.queue})`),
    row("precision", "Precision", `${d.dtype}${d.compile ? ", compiled" : ""}`),
  ];
}

function model(job, start) {
  const n = start?.data?.n_params;
  const arch = job.config?.model || {};
  const shape = ["n_layer", "n_embd", "n_head", "ctx"].filter((k) => k in arch).map((k) => `${k} ${arch[k]}`).join(", ");
  return [
    row("model", "Model", `${job.model}${shape ? ` (${shape})` : ""}`),
    row("parameters", "Parameters", typeof n === "number" ? fmtInt(n) : "—"),
    row("size", "Size", typeof n === "number" ? `${fmtBytes(n * WEIGHT_BYTES)} (float32 weights)` : "—"),
  ];
}

function metadata(job) {
  const entries = Object.entries(job.metadata || {});
  if (!entries.length) return row("metadata", "Metadata", el("span", { class: "muted" }, "none"));
  return row("metadata", "Metadata", el("ul", { class: "kv" }, entries.map(([k, v]) =>
    el("li", {}, el("span", { class: "mono" }, k), " = ", el("span", { class: "mono" }, String(v))))));
}

/** files: {id: file object} as GET /v1/files/{id} answers (missing: not loaded or deleted). */
export function summaryCard() {
  const list = el("dl", { class: "run-summary", id: "run-summary" });
  const node = el("section", { class: "card", "aria-labelledby": "run-h" }, el("h2", { id: "run-h" }, "Run"), list);
  return {
    node,
    render(job, files, events) {
      const start = startEvent(events);
      const d = start?.data || {};
      const file = (id) => (id ? files[id] || { id } : null);
      clear(list, [
        row("training-file", "Training file", fileText(file(job.training_file), d.train_tokens)),
        row("validation-file", "Validation file", job.validation_file
          ? fileText(file(job.validation_file), d.val_tokens || undefined)
          : `none: held out from the training file${d.val_tokens ? ` (${fmtInt(d.val_tokens)} tokens)` : ""}`),
        model(job, start), device(job, start), timings(job, events), metadata(job)].flat(2));
    },
  };
}
