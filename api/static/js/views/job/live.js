// Following a live job: the SSE stream first (read with fetch so it can carry the Bearer header,
// resumed with Last-Event-ID); when it drops, poll /metrics and the job until it is time to retry
// the stream, with a back-off that doubles up to 30 s. Ends when the job does.
//
// The stream sends a metrics row only once it is final (api/routes/events.py), but /metrics gives
// the newest row as it is now, and a row can still gain its val_loss after its train_loss was
// stored. So the last point drawn from /metrics is asked for again: polls start after the step
// before it, and the stream resumes there too; the chart replaces a point it gets twice.

import { ApiError, streamJob } from "../../api.js";
import { sleep } from "../../util.js";
import { HISTORY_POINTS } from "./endpoints.js";

const POLL_MS = 2000;
const FIRST_BACKOFF_MS = 2000;
const MAX_BACKOFF_MS = 30000;
const CATCH_UP_PAGES = 5; // per poll, of 1000 points each

/**
 * id, signal, endpoints: jobEndpoints(); metrics: LiveMetrics (for the last step drawn);
 * ended(): whether the job is in a terminal status;
 * on: {metric(m), job(obj), message(event), mode("stream" | "polling" | "done")}.
 */
export class LiveFeed {
  lastEventId = null;
  #plainStream = false; // the server refused our Last-Event-ID: connect without one

  constructor({ id, signal, endpoints, metrics, ended, on }) {
    Object.assign(this, { id, signal, endpoints, metrics, ended, on });
  }

  /** The history so far, downsampled on the server. */
  async loadHistory() {
    const page = await this.endpoints.metrics({ max_points: HISTORY_POINTS });
    for (const m of page.data || []) this.on.metric(m);
    this.metrics.restartRate();
  }

  /** Fetch the points from the last one drawn on (it may have changed since), then the job. */
  async pollOnce() {
    for (let pages = 0; pages < CATCH_UP_PAGES; pages++) {
      const lastStep = this.metrics.lastStep;
      const page = await this.endpoints.metrics({ after_step: lastStep >= 1 ? lastStep - 1 : undefined, limit: 1000 });
      for (const m of page.data || []) this.on.metric(m);
      if (!page.has_more) break;
    }
    this.on.job(await this.endpoints.job());
  }

  /** The stream's events (api/routes/events.py): `metrics` (one point as in /metrics), `status`
   *  ({status, message, created_at, job}) and `message` (an OpenAI event object). */
  handleEvent(ev) {
    if (ev.id) this.lastEventId = ev.id;
    let data;
    try { data = JSON.parse(ev.data); } catch { return; }
    if (!data || typeof data !== "object") return;
    if (ev.event === "metrics") this.on.metric(data);
    else if (ev.event === "status") this.on.job(data.job && typeof data.job === "object" ? data.job : { status: data.status });
    else if (ev.event === "message") this.on.message(data);
  }

  /** Where to resume (the stream's ids are "<step>.<seq>"): after the stream's own last id, or,
   *  when /metrics (the history, a poll) drew further, at the last point drawn, which the stream
   *  then sends again as final. */
  resumeFrom() {
    const lastStep = this.metrics.lastStep;
    let from = this.lastEventId;
    const m = /^(-?\d+)\.(\d+)$/.exec(from || "");
    if (m && lastStep > Number(m[1])) from = `${Math.max(Number(m[1]), lastStep - 1)}.${m[2]}`;
    if (!from && lastStep >= 0 && !this.#plainStream) from = `${lastStep - 1}.0`;
    return from;
  }

  /** Read the stream until it ends: "ended" cleanly (the job ended, or the server restarted),
   *  "dropped" (an error: back off), "restart" (without Last-Event-ID) or "stop" (closed, or 401). */
  async #stream() {
    try {
      this.on.mode("stream");
      await streamJob(this.id, { lastEventId: this.resumeFrom(), signal: this.signal, onEvent: (ev) => this.handleEvent(ev) });
      return "ended";
    } catch (e) {
      if (this.signal.aborted) return "stop";
      if (e instanceof ApiError && e.status === 401) return "stop";
      if (e instanceof ApiError && e.status === 400 && e.param === "Last-Event-ID") {
        this.lastEventId = null; // an id the server does not know: start the stream from scratch
        this.#plainStream = true;
        return "restart";
      }
      return "dropped";
    }
  }

  /** Catch up by polling (fills any gap and reads the status) until it is time to retry the stream. */
  async #pollFor(ms) {
    this.on.mode("polling");
    const until = Date.now() + ms;
    do {
      try { await this.pollOnce(); } catch { if (this.signal.aborted) return; }
      if (this.ended()) break;
      await sleep(POLL_MS, this.signal);
    } while (!this.signal.aborted && Date.now() < until);
  }

  /** Follow the job until it ends (then one last poll, mode "done"; resolves true) or until the
   *  page goes away or the key is refused (resolves false). */
  async follow() {
    let backoff = FIRST_BACKOFF_MS;
    while (!this.signal.aborted && !this.ended()) {
      const outcome = await this.#stream();
      if (outcome === "stop") return false;
      if (outcome === "restart") continue;
      backoff = outcome === "ended" ? FIRST_BACKOFF_MS : Math.min(MAX_BACKOFF_MS, backoff * 2);
      if (this.signal.aborted) return false;
      await this.#pollFor(backoff);
    }
    if (this.signal.aborted) return false;
    try { await this.pollOnce(); } catch { /* shown already */ }
    this.on.mode("done");
    return true;
  }
}
