// Job page: live loss and learning-rate charts, progress, controls, checkpoints, events, text
// generation and downloads. This module wires the pieces in job/ together:
//   header.js (title, status, live mode, errors)   actions.js (pause / resume / cancel)
//   model_actions.js (clone the job, delete its model)
//   progress.js + metrics.js (stats, ETA)           charts.js (loss, dynamics, system; x_axis.js)
//   checkpoints.js, events.js, models.js            generate.js, downloads.js (the model cards)
//   summary.js (files, model, metadata, timings, device)   config.js (every hyperparameter)
//   live.js (history, then the SSE stream with a polling fallback)   endpoints.js (the URLs)
// Client-side arrays are bounded (Series.max) and the events log is capped.

import { loadHyperparameterSchema } from "../served.js";
import { el, sleep, toast } from "../util.js";
import { jobActions } from "./job/actions.js";
import { jobCharts } from "./job/charts.js";
import { checkpointsCard } from "./job/checkpoints.js";
import { configCard } from "./job/config.js";
import { downloadCard } from "./job/downloads.js";
import { jobEndpoints } from "./job/endpoints.js";
import { eventsCard } from "./job/events.js";
import { generateCard } from "./job/generate.js";
import { jobHeader } from "./job/header.js";
import { LiveFeed } from "./job/live.js";
import { LiveMetrics } from "./job/metrics.js";
import { modelActions } from "./job/model_actions.js";
import { jobModels } from "./job/models.js";
import { progressCard } from "./job/progress.js";
import { summaryCard } from "./job/summary.js";

const REFRESH_MS = 10000; // job, checkpoints, events while live
const SIDE_REFRESH_DELAY_MS = 300; // after a checkpoint event, let its row land first

/** statuses: the served status sets (served.js). */
export function mountJob(root, { id, statuses }) {
  const page = new JobPage(id, statuses);
  root.append(...page.nodes());
  page.charts.mount();
  page.open();
  return { destroy() { page.destroy(); } };
}

/** One job's page: its pieces, the state they show and how it is kept current. */
class JobPage {
  #sideTimer = null;

  constructor(id, statuses) {
    this.id = id;
    this.statuses = statuses;
    this.abort = new AbortController();
    this.signal = this.abort.signal;
    this.endpoints = jobEndpoints(id, this.signal);
    this.state = { job: null, checkpoints: [], mode: "loading", files: {}, schema: null,
      deleted: new Set(), historyLoaded: false, checkedModel: null };
    this.#createPieces();
  }

  #createPieces() {
    const { id, signal, endpoints, statuses } = this;
    this.metrics = new LiveMetrics();
    this.charts = jobCharts();
    this.progress = progressCard({ charts: this.charts, metrics: this.metrics, statuses });
    this.actions = jobActions({ statuses, request: (action) => this.request(action), rerender: () => this.renderJob() });
    this.modelActions = modelActions({ jobId: id, deleteModel: endpoints.deleteModel,
      onDeleted: (model) => this.modelDeleted(model) });
    this.header = jobHeader(id, el("div", { class: "head-actions" }, this.actions.node, this.modelActions.node));
    this.generate = generateCard({ signal });
    this.downloads = downloadCard({ signal });
    this.checkpoints = checkpointsCard();
    this.events = eventsCard();
    this.summary = summaryCard();
    this.config = configCard();
    this.feed = new LiveFeed({
      id, signal, endpoints, metrics: this.metrics, ended: () => this.ended(),
      on: {
        metric: (m) => this.addMetric(m), job: (obj) => this.applyJob(obj),
        message: (e) => this.addEvent(e), mode: (mode) => this.setMode(mode),
      },
    });
  }

  nodes() {
    return [
      this.header.node,
      this.header.errorBox,
      this.progress.node,
      el("div", { class: "grid-2" }, this.summary.node, this.events.node),
      this.charts.lossCard,
      el("div", { class: "grid-3" }, this.charts.lrCard, ...this.charts.dynamicsCards),
      el("div", { class: "grid-2" }, ...this.charts.systemCards),
      el("div", { class: "grid-2" }, this.generate.node, el("div", {}, this.downloads.node, this.checkpoints.node)),
      this.config.node];
  }

  ended() { return this.statuses.terminal.has(this.state.job.status); }

  // -- rendering --------------------------------------------------------------------------------
  renderJob() {
    const { job, deleted, historyLoaded } = this.state;
    this.header.showJob(job, deleted);
    this.actions.render(job);
    this.renderModels();
    this.progress.update(job);
    this.renderRun();
    if (historyLoaded && this.ended()) this.charts.ended(job.status); // no point will come now
  }

  /** The run's summary and configuration (each once what it needs has arrived). */
  renderRun() {
    const { job, files, schema } = this.state;
    this.summary.render(job, files, this.events.all());
    if (schema) this.config.render(job, schema);
  }

  /** The job's files and the served defaults, read once. */
  async loadRunDetails() {
    const job = this.state.job;
    const ids = [job.training_file, job.validation_file].filter(Boolean);
    const [schema, ...files] = await Promise.all([
      loadHyperparameterSchema().catch(() => null),
      ...ids.map((fid) => this.endpoints.file(fid).catch(() => null))]);
    this.state.schema = schema;
    for (const f of files) if (f) this.state.files[f.id] = f;
    this.renderRun();
  }

  renderModels() {
    const { job, checkpoints, deleted } = this.state;
    const models = jobModels(job, checkpoints).filter(([mid]) => !deleted.has(mid));
    this.generate.setModels(models);
    this.downloads.setModels(models);
  }

  /** Whether the succeeded job's model still exists (asked once): Delete model offers it; a model
   *  deleted since leaves the pickers. */
  async checkModel() {
    const { job } = this.state;
    const model = job.status === "succeeded" ? job.fine_tuned_model : null;
    if (!model || this.state.checkedModel === model) return;
    this.state.checkedModel = model;
    try {
      await this.endpoints.model(model);
      if (!this.state.deleted.has(model)) this.modelActions.setModel(model);
    } catch (e) {
      if (e.status === 404) this.modelDeleted(model);
      else if (e.name !== "AbortError") this.modelActions.setModel(model); // the delete will say
    }
  }

  modelDeleted(model) {
    this.state.deleted.add(model);
    this.modelActions.setModel(null);
    this.renderJob();
  }

  setMode(mode) {
    this.state.mode = mode;
    this.header.setMode(mode);
  }

  // -- data -------------------------------------------------------------------------------------
  addMetric(m) {
    if (typeof m.step !== "number") return;
    this.charts.add(m);
    this.metrics.observe(m);
    this.charts.draw();
    this.progress.update();
  }

  applyJob(obj) {
    const state = this.state;
    const before = state.job ? state.job.status : null;
    state.job = { ...(state.job || {}), ...obj };
    this.renderJob();
    this.checkModel();
    if (before && before !== state.job.status) {
      this.refreshSide();
      if (state.job.status === "succeeded") toast(`Job ${this.id} succeeded`, "ok");
    }
  }

  addEvent(e) {
    this.events.prepend(e);
    this.renderRun();
    if (/checkpoint/i.test(e.message || "")) this.refreshSideSoon();
  }

  /** Checkpoints and events, read again. */
  async refreshSide() {
    try {
      const [ck, ev] = await Promise.all([this.endpoints.checkpoints(), this.endpoints.events()]);
      this.state.checkpoints = ck.data || [];
      this.checkpoints.render(this.state.checkpoints);
      this.renderModels();
      this.events.render(ev.data || []);
      this.renderRun();
    } catch (e) {
      if (e.name !== "AbortError") console.warn("refresh failed:", e.message);
    }
  }

  refreshSideSoon() {
    clearTimeout(this.#sideTimer);
    this.#sideTimer = setTimeout(() => this.refreshSide(), SIDE_REFRESH_DELAY_MS);
  }

  /** While the job is live: the job, checkpoints and events every REFRESH_MS besides the stream. */
  async periodicRefresh() {
    const signal = this.signal;
    while (!signal.aborted && this.state.job && !this.ended()) {
      await sleep(REFRESH_MS, signal);
      if (signal.aborted) return;
      try { this.applyJob(await this.endpoints.job()); } catch { /* next round */ }
      await this.refreshSide();
    }
  }

  // -- actions and start ------------------------------------------------------------------------
  async request(action) {
    this.applyJob(await this.endpoints.control(action));
    if (action === "resume" && this.state.mode === "done") this.start(); // follow the job again
  }

  async start() {
    if (this.ended()) { this.setMode("done"); return; }
    this.periodicRefresh();
    if (await this.feed.follow()) this.refreshSide();
  }

  /** The job, its history so far, then following it live. */
  async open() {
    const id = this.id;
    try {
      this.applyJob(await this.endpoints.job());
      document.title = `${id} · fromscratch`;
      this.loadRunDetails();
      await this.feed.loadHistory();
      this.state.historyLoaded = true;
      this.renderJob();
      this.refreshSide();
      await this.start();
    } catch (e) {
      if (e.name === "AbortError" || this.signal.aborted) return;
      this.header.showLoadError(e.status === 404 ? `No job ${id} (it does not exist or belongs to another key).`
        : `Could not load the job: ${e.message}`);
      this.setMode("done");
    }
  }

  destroy() {
    this.abort.abort();
    this.charts.destroy();
    this.actions.destroy();
    this.modelActions.destroy();
    clearTimeout(this.#sideTimer);
  }
}
