// Job page: live loss and learning-rate charts, progress, controls, checkpoints, events, text
// generation and downloads. This module wires the pieces in job/ together:
//   header.js (title, status, live mode, errors)   actions.js (pause / resume / cancel)
//   progress.js + metrics.js (stats, ETA)           charts.js (loss and learning-rate charts)
//   checkpoints.js, events.js, models.js            generate.js, downloads.js (the model cards)
//   live.js (history, then the SSE stream with a polling fallback)   endpoints.js (the URLs)
// Client-side arrays are bounded (Series.max) and the events log is capped.

import { el, sleep, toast } from "../util.js";
import { jobActions } from "./job/actions.js";
import { jobCharts } from "./job/charts.js";
import { checkpointsCard } from "./job/checkpoints.js";
import { downloadCard } from "./job/downloads.js";
import { jobEndpoints } from "./job/endpoints.js";
import { eventsCard } from "./job/events.js";
import { generateCard } from "./job/generate.js";
import { jobHeader } from "./job/header.js";
import { LiveFeed } from "./job/live.js";
import { LiveMetrics } from "./job/metrics.js";
import { jobModels } from "./job/models.js";
import { progressCard } from "./job/progress.js";

const REFRESH_MS = 10000; // job, checkpoints, events while live
const SIDE_REFRESH_DELAY_MS = 300; // after a checkpoint event, let its row land first

/** statuses: the served status sets (served.js). */
export function mountJob(root, { id, statuses }) {
  const abort = new AbortController();
  const signal = abort.signal;
  const endpoints = jobEndpoints(id, signal);
  const state = { job: null, checkpoints: [], mode: "loading" };
  const ended = () => statuses.terminal.has(state.job.status);

  // -- the pieces -------------------------------------------------------------------------------
  const metrics = new LiveMetrics();
  const charts = jobCharts();
  const progress = progressCard({ charts, metrics, statuses });
  const actions = jobActions({ statuses, request, rerender: renderJob });
  const header = jobHeader(id, actions.node);
  const generate = generateCard({ endpoints });
  const downloads = downloadCard({ signal });
  const checkpoints = checkpointsCard();
  const events = eventsCard();
  const feed = new LiveFeed({
    id, signal, endpoints, metrics, ended,
    on: { metric: addMetric, job: applyJob, message: addEvent, mode: setMode },
  });

  root.append(
    header.node,
    header.errorBox,
    progress.node,
    charts.lossCard,
    el("div", { class: "grid-2" }, charts.lrCard, downloads.node),
    el("div", { class: "grid-2" }, generate.node, checkpoints.node),
    events.node);
  charts.mount();

  // -- rendering --------------------------------------------------------------------------------
  function renderJob() {
    header.showJob(state.job);
    actions.render(state.job.status);
    renderModels();
    progress.update(state.job);
  }

  function renderModels() {
    const models = jobModels(state.job, state.checkpoints);
    generate.setModels(models);
    downloads.setModels(models);
  }

  function setMode(mode) {
    state.mode = mode;
    header.setMode(mode);
  }

  // -- data -------------------------------------------------------------------------------------
  function addMetric(m) {
    if (typeof m.step !== "number") return;
    charts.add(m);
    metrics.observe(m);
    charts.draw();
    progress.update();
  }

  function applyJob(obj) {
    const before = state.job ? state.job.status : null;
    state.job = { ...(state.job || {}), ...obj };
    renderJob();
    if (before && before !== state.job.status) {
      refreshSide();
      if (state.job.status === "succeeded") toast(`Job ${id} succeeded`, "ok");
    }
  }

  function addEvent(e) {
    events.prepend(e);
    if (/checkpoint/i.test(e.message || "")) refreshSideSoon();
  }

  /** Checkpoints and events, read again. */
  async function refreshSide() {
    try {
      const [ck, ev] = await Promise.all([endpoints.checkpoints(), endpoints.events()]);
      state.checkpoints = ck.data || [];
      checkpoints.render(state.checkpoints);
      renderModels();
      events.render(ev.data || []);
    } catch (e) {
      if (e.name !== "AbortError") console.warn("refresh failed:", e.message);
    }
  }

  let sideTimer = null;
  function refreshSideSoon() {
    clearTimeout(sideTimer);
    sideTimer = setTimeout(refreshSide, SIDE_REFRESH_DELAY_MS);
  }

  /** While the job is live: the job, checkpoints and events every REFRESH_MS besides the stream. */
  async function periodicRefresh() {
    while (!signal.aborted && state.job && !ended()) {
      await sleep(REFRESH_MS, signal);
      if (signal.aborted) return;
      try { applyJob(await endpoints.job()); } catch { /* next round */ }
      await refreshSide();
    }
  }

  // -- actions and start ------------------------------------------------------------------------
  async function request(action) {
    applyJob(await endpoints.control(action));
    if (action === "resume" && state.mode === "done") start(); // follow the job again
  }

  async function start() {
    if (ended()) { setMode("done"); return; }
    periodicRefresh();
    if (await feed.follow()) refreshSide();
  }

  (async () => {
    try {
      applyJob(await endpoints.job());
      document.title = `${id} · fromscratch`;
      await feed.loadHistory();
      refreshSide();
      await start();
    } catch (e) {
      if (e.name === "AbortError" || signal.aborted) return;
      header.showLoadError(e.status === 404 ? `No job ${id} (it does not exist or belongs to another key).`
        : `Could not load the job: ${e.message}`);
      setMode("done");
    }
  })();

  return {
    destroy() {
      abort.abort();
      charts.destroy();
      actions.destroy();
      clearTimeout(sideTimer);
    },
  };
}
