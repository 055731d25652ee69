// Job page: live loss and learning-rate charts, progress, controls, checkpoints, events, text
// generation and downloads.
//
// Live data: the history comes from /metrics?max_points=1000 (downsampled on the server), then the
// SSE stream (read with fetch so it can carry the Bearer header; resumed with Last-Event-ID). When
// the stream drops the page polls /metrics?after_step=<last step> and retries the stream with a
// growing back-off. Client-side arrays are bounded (Series.max) and the events log is capped.

import { api, ApiError, downloadModel, query, streamJob } from "../api.js";
import { LineChart, Series } from "../chart.js";
import {
  badge, clear, el, fmtBytes, fmtDuration, fmtInt, fmtLoss, fmtTime, progressBar, setProgress, sleep,
  TERMINAL, toast,
} from "../util.js";

const HISTORY_POINTS = 1000;
const MAX_POINTS = 2000; // per series, client side
const MAX_EVENTS = 200; // rows in the events log
const POLL_MS = 2000;
const REFRESH_MS = 10000; // job, checkpoints, events while live

const FORMATS = [
  ["gguf", "GGUF (llama.cpp)"],
  ["hf", "Hugging Face"],
  ["onnx", "ONNX"],
  ["checkpoint", "Checkpoint"],
];

/** Learning rates as "1e-3", "2.5e-4": one notation on the whole axis. */
function fmtLr(v) {
  if (v === 0) return "0";
  const [m, e] = v.toExponential(2).split("e");
  return `${+m}e${+e}`;
}

export function mountJob(root, { id }) {
  const abort = new AbortController();
  const signal = abort.signal;
  const state = {
    job: null, lastStep: -1, lastEventId: null, mode: "loading", checkpoints: [], rate: null,
    statusSeen: null, refreshTimer: null,
  };
  const train = new Series({ name: "train loss", color: "#2563eb", max: MAX_POINTS });
  const val = new Series({ name: "val loss", color: "#ea580c", max: MAX_POINTS, markers: true });
  const lr = new Series({ name: "learning rate", color: "#059669", max: MAX_POINTS });

  // -- layout ---------------------------------------------------------------------------------
  const title = el("h1", { class: "mono job-title" }, id);
  const statusSlot = el("span", { class: "status-slot" });
  const liveMode = el("span", { class: "live-mode small muted", id: "live-mode", dataset: { mode: "loading" } }, "");
  const modelLine = el("p", { class: "muted model-line" });
  const cancelBtn = el("button", { type: "button", class: "danger", id: "btn-cancel", disabled: true }, "Cancel");
  const pauseBtn = el("button", { type: "button", class: "secondary", id: "btn-pause", disabled: true }, "Pause");
  const resumeBtn = el("button", { type: "button", class: "secondary", id: "btn-resume", disabled: true }, "Resume");
  const controls = el("div", { class: "controls", role: "group", "aria-label": "Job controls" }, pauseBtn, resumeBtn, cancelBtn);

  const stat = (label, key) => {
    const dd = el("dd", { id: `stat-${key}` }, "—");
    return [el("div", { class: "stat" }, el("dt", {}, label), dd), dd];
  };
  const [stepBox, stepDd] = stat("Step", "step");
  const [lossBox, lossDd] = stat("Train loss", "train-loss");
  const [valBox, valDd] = stat("Val loss", "val-loss");
  const [tpsBox, tpsDd] = stat("Tokens/s", "tokens-per-s");
  const [etaBox, etaDd] = stat("ETA", "eta");
  const [tokBox, tokDd] = stat("Trained tokens", "trained-tokens");
  const bar = progressBar(0, 0, "Training progress");
  const stats = el("dl", { class: "stats" }, stepBox, lossBox, valBox, tpsBox, etaBox, tokBox);
  const errorBox = el("div", { class: "error-banner", role: "alert", hidden: true });

  const lossCanvas = el("canvas", { id: "loss-chart", class: "chart", role: "img", "aria-label": "Loss chart" });
  const lrCanvas = el("canvas", { id: "lr-chart", class: "chart chart-small", role: "img", "aria-label": "Learning-rate chart" });
  const logToggle = el("input", { type: "checkbox", id: "log-scale" });
  const legend = (series) => el("ul", { class: "legend" }, series.map((s) =>
    el("li", {}, el("span", { class: "swatch", style: `background:${s.color}` }), s.name)));

  const lossCard = el("section", { class: "card chart-card", "aria-labelledby": "loss-h" },
    el("div", { class: "card-head" }, el("h2", { id: "loss-h" }, "Loss"), legend([train, val]),
      el("label", { class: "toggle", for: "log-scale" }, logToggle, " Log scale")),
    lossCanvas);
  const lrCard = el("section", { class: "card chart-card", "aria-labelledby": "lr-h" },
    el("div", { class: "card-head" }, el("h2", { id: "lr-h" }, "Learning rate"), legend([lr])), lrCanvas);

  // generate
  const genModel = el("select", { id: "gen-model", name: "gen-model" });
  const prompt = el("textarea", { id: "gen-prompt", rows: 3, placeholder: "ROMEO:" }, "");
  const maxTokens = el("input", { id: "gen-max-tokens", type: "number", min: 1, max: 2048, value: 200 });
  const temperature = el("input", { id: "gen-temperature", type: "number", min: 0, max: 5, step: 0.1, value: 0.8 });
  const topK = el("input", { id: "gen-top-k", type: "number", min: 1, placeholder: "off" });
  const seed = el("input", { id: "gen-seed", type: "number", placeholder: "random" });
  const genBtn = el("button", { type: "submit", class: "primary", disabled: true }, "Generate");
  const genOut = el("pre", { class: "gen-output", id: "gen-output", "aria-live": "polite" });
  const genForm = el("form", { class: "card", "aria-labelledby": "gen-h" },
    el("h2", { id: "gen-h" }, "Generate text"),
    el("div", { class: "field" }, el("label", { for: "gen-model" }, "Model or checkpoint"), genModel),
    el("div", { class: "field" }, el("label", { for: "gen-prompt" }, "Prompt"), prompt),
    el("div", { class: "grid grid-4" },
      el("div", { class: "field" }, el("label", { for: "gen-max-tokens" }, "Max tokens"), maxTokens),
      el("div", { class: "field" }, el("label", { for: "gen-temperature" }, "Temperature"), temperature),
      el("div", { class: "field" }, el("label", { for: "gen-top-k" }, "Top-k"), topK),
      el("div", { class: "field" }, el("label", { for: "gen-seed" }, "Seed"), seed)),
    el("div", { class: "actions" }, genBtn), genOut);

  // downloads
  const dlModel = el("select", { id: "dl-model", name: "dl-model" });
  for (const sel of [genModel, dlModel]) sel.addEventListener("change", () => { sel.dataset.chosen = sel.value; });
  const dlButtons = FORMATS.map(([fmt, label]) =>
    el("button", { type: "button", class: "secondary", id: `dl-${fmt}`, disabled: true, dataset: { format: fmt } }, label));
  const dlBar = progressBar(0, 1, "Download progress");
  const dlText = el("span", { class: "small", role: "status" });
  const dlProgress = el("div", { class: "upload-progress", hidden: true }, dlBar, dlText);
  const dlCard = el("section", { class: "card", "aria-labelledby": "dl-h" },
    el("h2", { id: "dl-h" }, "Download"),
    el("div", { class: "field" }, el("label", { for: "dl-model" }, "Model or checkpoint"), dlModel),
    el("div", { class: "actions wrap" }, dlButtons), dlProgress,
    el("p", { class: "help" }, "The first download of a format is exported on the server and may take a moment."));

  // checkpoints and events
  const ckptBody = el("tbody");
  const ckptCard = el("section", { class: "card", "aria-labelledby": "ck-h" },
    el("h2", { id: "ck-h" }, "Checkpoints"),
    el("div", { class: "table-wrap" }, el("table", { class: "table", id: "checkpoints" },
      el("thead", {}, el("tr", {}, ["Step", "Train loss", "Val loss", "Model id", "Created"].map((h) => el("th", { scope: "col" }, h)))),
      ckptBody)));
  const eventsList = el("ol", { class: "events", id: "events" });
  const eventsCard = el("section", { class: "card", "aria-labelledby": "ev-h" },
    el("h2", { id: "ev-h" }, "Events"), eventsList);

  root.append(
    el("div", { class: "page-head job-head" },
      el("div", {}, el("a", { href: "#/jobs", class: "back small" }, "← All jobs"),
        el("div", { class: "title-row" }, title, statusSlot, liveMode), modelLine),
      controls),
    errorBox,
    el("section", { class: "card progress-card", "aria-label": "Progress" }, bar, stats),
    lossCard,
    el("div", { class: "grid-2" }, lrCard, dlCard),
    el("div", { class: "grid-2" }, genForm, ckptCard),
    eventsCard);

  const lossChart = new LineChart(lossCanvas, [train, val], { yLabel: "loss", title: "Loss chart", log: false });
  const lrChart = new LineChart(lrCanvas, [lr], { yLabel: "lr", title: "Learning-rate chart", yFormat: fmtLr });
  logToggle.addEventListener("change", () => lossChart.set({ log: logToggle.checked }));

  // -- rendering --------------------------------------------------------------------------------
  let statsPending = false;
  function renderStats() {
    if (statsPending) return;
    statsPending = true;
    requestAnimationFrame(() => { statsPending = false; paintStats(); });
  }

  function paintStats() {
    const job = state.job;
    if (!job) return;
    const p = job.progress || {};
    const total = p.total_steps || 0;
    const step = Math.max(p.step ?? 0, state.lastStep);
    setProgress(bar, step, total);
    stepDd.textContent = total ? `${fmtInt(step)} / ${fmtInt(total)}` : fmtInt(step >= 0 ? step : null);
    lossDd.textContent = fmtLoss(train.length ? train.lastY : p.train_loss);
    valDd.textContent = fmtLoss(val.length ? val.lastY : p.val_loss);
    tpsDd.textContent = fmtInt(state.tokensPerS ?? p.tokens_per_s);
    const live = !TERMINAL.has(job.status);
    let eta = p.eta_seconds;
    if (live && state.rate && total) eta = Math.max(0, (total - step) / state.rate);
    etaDd.textContent = live ? fmtDuration(eta) : job.status === "succeeded" ? "done" : "—";
    tokDd.textContent = fmtInt(job.trained_tokens);
    lossChart.set({ xMax: total });
    lrChart.set({ xMax: total });
  }

  function renderJob() {
    const job = state.job;
    clear(statusSlot, badge(job.status));
    clear(modelLine, `${job.model || ""}`,
      job.fine_tuned_model ? el("span", {}, " → ", el("code", { id: "fine-tuned-model" }, job.fine_tuned_model)) : null,
      ` · created ${fmtTime(job.created_at)}`, job.finished_at ? ` · finished ${fmtTime(job.finished_at)}` : "");
    const s = job.status;
    cancelBtn.disabled = TERMINAL.has(s);
    pauseBtn.disabled = !(s === "running" || s === "queued");
    resumeBtn.disabled = s !== "paused";
    if (job.error && job.error.message) {
      errorBox.hidden = false;
      clear(errorBox, el("strong", {}, "Failed: "), job.error.message, job.error.code ? ` (${job.error.code})` : "");
    } else errorBox.hidden = true;
    renderModels();
    renderStats();
  }

  function setMode(mode) {
    state.mode = mode;
    liveMode.dataset.mode = mode;
    liveMode.textContent = { stream: "● live", polling: "● polling", done: "", loading: "loading…" }[mode] ?? mode;
  }

  function modelIds() {
    const ids = [];
    if (state.job && state.job.fine_tuned_model) ids.push([state.job.fine_tuned_model, "final model"]);
    for (const c of state.checkpoints.slice().sort((a, b) => b.step_number - a.step_number)) {
      if (c.fine_tuned_model_checkpoint && !ids.some(([mid]) => mid === c.fine_tuned_model_checkpoint)) {
        ids.push([c.fine_tuned_model_checkpoint, `checkpoint step ${c.step_number}`]);
      }
    }
    return ids;
  }

  function renderModels() {
    const ids = modelIds();
    for (const sel of [genModel, dlModel]) {
      const keep = sel.dataset.chosen; // what the user picked; otherwise the newest model
      clear(sel, ids.length ? ids.map(([mid, label]) => el("option", { value: mid }, `${label} — ${mid}`))
        : el("option", { value: "" }, "no model yet (waiting for a checkpoint)"));
      if (ids.some(([mid]) => mid === keep)) sel.value = keep;
    }
    genBtn.disabled = !ids.length;
    for (const b of dlButtons) b.disabled = !ids.length;
  }

  function renderCheckpoints() {
    const rows = state.checkpoints.slice().sort((a, b) => b.step_number - a.step_number);
    clear(ckptBody, rows.length ? rows.map((c) => {
      const m = c.metrics || {};
      return el("tr", {},
        el("td", {}, fmtInt(c.step_number)),
        el("td", {}, fmtLoss(m.train_loss)),
        el("td", {}, fmtLoss(m.valid_loss ?? m.val_loss)),
        el("td", { class: "mono small" }, c.fine_tuned_model_checkpoint || "—"),
        el("td", {}, fmtTime(c.created_at)));
    }) : el("tr", {}, el("td", { colspan: 5, class: "muted" }, "No checkpoints yet.")));
    renderModels();
  }

  function eventItem(e) {
    return el("li", { class: `event level-${e.level || "info"}` }, el("time", {}, fmtTime(e.created_at)),
      el("span", {}, e.message || ""));
  }

  function prependEvent(e) {
    if (eventsList.firstChild && eventsList.firstChild.classList.contains("muted")) eventsList.firstChild.remove();
    eventsList.prepend(eventItem(e));
    while (eventsList.childElementCount > MAX_EVENTS) eventsList.lastChild.remove();
  }

  let sideTimer = null;
  function refreshSideSoon() {
    clearTimeout(sideTimer);
    sideTimer = setTimeout(refreshSide, 300);
  }

  function renderEvents(events) {
    const shown = events.filter((e) => e.type !== "metrics").slice(0, MAX_EVENTS);
    const latestMetrics = events.find((e) => e.type === "metrics");
    clear(eventsList,
      latestMetrics ? el("li", { class: "event level-info" }, el("time", {}, fmtTime(latestMetrics.created_at)),
        el("span", {}, latestMetrics.message || "metrics")) : null,
      shown.map(eventItem),
      !shown.length && !latestMetrics ? el("li", { class: "muted" }, "No events yet.") : null);
  }

  // -- data -------------------------------------------------------------------------------------
  function addMetric(m) {
    if (typeof m.step !== "number") return;
    train.push(m.step, m.train_loss);
    lr.push(m.step, m.lr);
    const v = m.val_loss ?? m.valid_loss;
    if (v !== null && v !== undefined) val.push(m.step, v);
    else if (m.step <= val.lastX) val.truncate(m.step); // a resumed job: drop val points from here on
    if (m.tokens_per_s != null) state.tokensPerS = m.tokens_per_s;
    if (typeof m.created_at === "number") {
      // steps per second over the points seen live, for the ETA between job reads
      if (!state.rateOrigin || m.step < state.rateOrigin.step) state.rateOrigin = { t: m.created_at, step: m.step };
      else if (m.created_at - state.rateOrigin.t >= 1 && m.step > state.rateOrigin.step) {
        state.rate = (m.step - state.rateOrigin.step) / (m.created_at - state.rateOrigin.t);
      }
    }
    state.lastStep = m.step; // points arrive in step order; an earlier step means a resumed job
    lossChart.draw();
    lrChart.draw();
    renderStats();
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

  // The stream's events (api/routes/events.py): `metrics` (one point as in /metrics), `status`
  // ({status, message, created_at, job}) and `message` (an OpenAI event object).
  function handleEvent(ev) {
    if (ev.id) state.lastEventId = ev.id;
    let data;
    try { data = JSON.parse(ev.data); } catch { return; }
    if (!data || typeof data !== "object") return;
    if (ev.event === "metrics") addMetric(data);
    else if (ev.event === "status") applyJob(data.job && typeof data.job === "object" ? data.job : { status: data.status });
    else if (ev.event === "message") {
      prependEvent(data);
      if (/checkpoint/i.test(data.message || "")) refreshSideSoon();
    }
  }

  async function loadHistory() {
    const page = await api(`/fine_tuning/jobs/${encodeURIComponent(id)}/metrics${query({ max_points: HISTORY_POINTS })}`, { signal });
    for (const m of page.data || []) addMetric(m);
    state.rateOrigin = null; // history points may be decimated: measure the rate live
  }

  async function pollOnce() {
    for (let pages = 0; pages < 5; pages++) {
      const page = await api(`/fine_tuning/jobs/${encodeURIComponent(id)}/metrics${query({ after_step: state.lastStep >= 0 ? state.lastStep : undefined, limit: 1000 })}`, { signal });
      for (const m of page.data || []) addMetric(m);
      if (!page.has_more) break;
    }
    applyJob(await api(`/fine_tuning/jobs/${encodeURIComponent(id)}`, { signal }));
  }

  async function refreshSide() {
    try {
      const [ck, ev] = await Promise.all([
        api(`/fine_tuning/jobs/${encodeURIComponent(id)}/checkpoints${query({ limit: 100 })}`, { signal }),
        api(`/fine_tuning/jobs/${encodeURIComponent(id)}/events${query({ limit: 100 })}`, { signal }),
      ]);
      state.checkpoints = ck.data || [];
      renderCheckpoints();
      renderEvents(ev.data || []);
    } catch (e) {
      if (e.name !== "AbortError") console.warn("refresh failed:", e.message);
    }
  }

  async function periodicRefresh() {
    while (!signal.aborted && state.job && !TERMINAL.has(state.job.status)) {
      await sleep(REFRESH_MS, signal);
      if (signal.aborted) return;
      try { applyJob(await api(`/fine_tuning/jobs/${encodeURIComponent(id)}`, { signal })); } catch { /* next round */ }
      await refreshSide();
    }
  }

  async function live() {
    let backoff = 2000;
    while (!signal.aborted && !TERMINAL.has(state.job.status)) {
      try {
        setMode("stream");
        // Resume after the last step drawn, whether the stream or a poll brought it (the stream's
        // ids are "<step>.<seq>"); the first connection starts after the history already drawn.
        let from = state.lastEventId;
        const m = /^(-?\d+)\.(\d+)$/.exec(from || "");
        if (m && state.lastStep > Number(m[1])) from = `${state.lastStep}.${m[2]}`;
        if (!from && state.lastStep >= 0 && !state.plainStream) from = `${state.lastStep}.0`;
        await streamJob(id, { lastEventId: from, signal, onEvent: handleEvent });
        backoff = 2000; // ended cleanly (the job ended, or the server restarted)
      } catch (e) {
        if (signal.aborted) return;
        if (e instanceof ApiError && e.status === 401) return;
        if (e instanceof ApiError && e.status === 400 && e.param === "Last-Event-ID") {
          state.lastEventId = null; // an id the server does not know: start the stream from scratch
          state.plainStream = true;
          continue;
        }
        backoff = Math.min(30000, backoff * 2);
      }
      if (signal.aborted) return;
      // catch up by polling (fills any gap and reads the status), until it is time to retry the stream
      setMode("polling");
      const until = Date.now() + backoff;
      do {
        try { await pollOnce(); } catch (e) { if (signal.aborted) return; }
        if (TERMINAL.has(state.job.status)) break;
        await sleep(POLL_MS, signal);
      } while (!signal.aborted && Date.now() < until);
    }
    if (!signal.aborted) {
      try { await pollOnce(); } catch { /* shown already */ }
      setMode("done");
      refreshSide();
    }
  }

  // -- actions ----------------------------------------------------------------------------------
  let cancelArmed = null;
  cancelBtn.addEventListener("click", () => {
    if (!cancelArmed) {
      cancelBtn.textContent = "Confirm cancel";
      cancelArmed = setTimeout(() => { cancelArmed = null; cancelBtn.textContent = "Cancel"; }, 4000);
      return;
    }
    clearTimeout(cancelArmed);
    cancelArmed = null;
    cancelBtn.textContent = "Cancel";
    act("cancel");
  });
  pauseBtn.addEventListener("click", () => act("pause"));
  resumeBtn.addEventListener("click", () => act("resume"));

  async function act(action) {
    for (const b of [cancelBtn, pauseBtn, resumeBtn]) b.disabled = true;
    try {
      applyJob(await api(`/fine_tuning/jobs/${encodeURIComponent(id)}/${action}`, { method: "POST", signal }));
      toast(`${action} requested`);
      if (action === "resume" && state.mode === "done") start();
    } catch (e) {
      if (e.name !== "AbortError") toast(`Could not ${action}: ${e.message}`, "error");
      renderJob();
    }
  }

  genForm.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const model = genModel.value;
    if (!model) return;
    genBtn.disabled = true;
    genBtn.textContent = "Generating…";
    genOut.textContent = "";
    genOut.classList.remove("error-text");
    const num = (input) => (input.value.trim() === "" ? undefined : Number(input.value));
    try {
      const body = { prompt: prompt.value, max_tokens: num(maxTokens), temperature: num(temperature), top_k: num(topK), seed: num(seed) };
      const res = await api(`/models/${encodeURIComponent(model)}/generate`, { method: "POST", body, signal });
      genOut.textContent = "";
      genOut.append(el("span", { class: "prompt-echo" }, prompt.value), res.text ?? "");
    } catch (e) {
      if (e.name === "AbortError") return;
      genOut.textContent = e.message;
      genOut.classList.add("error-text");
    } finally {
      genBtn.disabled = !modelIds().length;
      genBtn.textContent = "Generate";
    }
  });

  for (const b of dlButtons) {
    b.addEventListener("click", async () => {
      const model = dlModel.value, fmt = b.dataset.format;
      if (!model) return;
      for (const x of dlButtons) x.disabled = true;
      dlProgress.hidden = false;
      dlProgress.classList.remove("done");
      setProgress(dlBar, 0, 1);
      dlText.textContent = `Preparing ${fmt}…`;
      try {
        const { name, size } = await downloadModel(model, fmt, {
          signal,
          onProgress: (got, total) => {
            setProgress(dlBar, got, total || got);
            dlText.textContent = `Downloading ${fmt}: ${fmtBytes(got)}${total ? ` of ${fmtBytes(total)}` : ""}`;
          },
        });
        setProgress(dlBar, 1, 1);
        dlProgress.classList.add("done");
        dlText.textContent = `Saved ${name} (${fmtBytes(size)})`;
      } catch (e) {
        if (e.name === "AbortError") return;
        dlText.textContent = `Download failed: ${e.message}`;
      } finally {
        for (const x of dlButtons) x.disabled = !modelIds().length;
      }
    });
  }

  // -- start ----------------------------------------------------------------------------------
  async function start() {
    if (!TERMINAL.has(state.job.status)) {
      periodicRefresh();
      await live();
    } else setMode("done");
  }

  (async () => {
    try {
      applyJob(await api(`/fine_tuning/jobs/${encodeURIComponent(id)}`, { signal }));
      document.title = `${id} · fromscratch`;
      await loadHistory();
      refreshSide();
      await start();
    } catch (e) {
      if (e.name === "AbortError" || signal.aborted) return;
      errorBox.hidden = false;
      errorBox.textContent = e.status === 404 ? `No job ${id} (it does not exist or belongs to another key).`
        : `Could not load the job: ${e.message}`;
      setMode("done");
    }
  })();

  return {
    destroy() {
      abort.abort();
      lossChart.destroy();
      lrChart.destroy();
      clearTimeout(cancelArmed);
      clearTimeout(sideTimer);
    },
  };
}
