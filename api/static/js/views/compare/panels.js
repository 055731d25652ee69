// The comparison's charts, one curve per run in its colour, in groups as the job page has them:
// train and validation loss, train and validation token accuracy, the training dynamics (learning
// rate, gradient norm, tokens/s) and the system (process CPU and memory, device use and memory); a
// group no run recorded says so instead. With smoothing, each run's curve is the EMA of its points (ema.js)
// drawn over the raw points, which stay faintly behind it; the read-out gives both. A sparse curve
// (fewer than SMOOTH_MIN_POINTS: a few evaluations) is never smoothed: its raw points, bold.

import { LineChart, Series, formatCompact, formatNumber } from "../../chart.js";
import { el } from "../../util.js";
import { pointX, X_AXES } from "../x_axis.js";
import { ema, weightFor } from "./ema.js";
import { runColor } from "./runs.js";

const percent = (v) => `${formatNumber(v * 100)}%`;
const MARKERS_UP_TO = 40; // points: a sparse curve (evaluations) shows its points

const PANELS = [
  { key: "train-loss", field: "train_loss", title: "Train loss", y: "loss", empty: "no train loss recorded yet" },
  { key: "val-loss", field: "val_loss", title: "Validation loss", y: "loss",
    empty: "no validation loss recorded for these runs" },
  { key: "train-accuracy", field: "train_accuracy", title: "Train token accuracy", y: "accuracy", format: percent,
    empty: "no train accuracy recorded for these runs" },
  { key: "val-accuracy", field: "val_accuracy", title: "Validation token accuracy", y: "accuracy", format: percent,
    empty: "no validation accuracy recorded for these runs" },
];

const finite = (v) => typeof v === "number" && Number.isFinite(v);

const bytes = (v) => `${formatCompact(v)}B`;
const GROUPS = [
  { key: "dynamics", title: "Training dynamics", empty: "no learning rate, gradient norm or throughput recorded", specs: [
    { key: "lr", field: "lr", title: "Learning rate", y: "lr" },
    { key: "grad-norm", field: "grad_norm", title: "Gradient norm", y: "norm" },
    { key: "tokens-per-s", field: "tokens_per_s", title: "Tokens/s", y: "tokens/s", format: formatCompact }] },
  { key: "system", title: "System", empty: "no system metrics recorded for these runs", specs: [
    { key: "cpu", field: "cpu_percent", title: "Process CPU", y: "%" },
    { key: "rss", field: "rss_bytes", title: "Process memory (RSS)", y: "bytes", format: bytes },
    { key: "gpu-util", field: "gpu_utilization", title: "Device utilization", y: "%" },
    { key: "gpu-memory", field: "gpu_memory_bytes", title: "Device memory", y: "bytes", format: bytes }] },
];

/** A run's curve of `field` against `xField` (x_axis.js): the points that have both. */
function curve(run, field, xField) {
  const xs = [], ys = [];
  for (const p of run.points) {
    const x = pointX(p, xField, run.points[0]);
    if (!finite(p[field]) || !finite(x)) continue;
    if (xs.length && x <= xs[xs.length - 1]) continue; // x must increase (tokens seen and time do)
    xs.push(x);
    ys.push(p[field]);
  }
  return { xs, ys };
}

function panel(spec) {
  const canvas = el("canvas", { id: `cmp-${spec.key}`, class: "chart chart-compare", role: "img",
    "aria-label": spec.title, dataset: { field: spec.field } });
  const node = el("section", { class: "card chart-card", "aria-labelledby": `cmp-${spec.key}-h` },
    el("h3", { id: `cmp-${spec.key}-h`, class: "chart-title" }, spec.title), canvas);
  let chart = null;
  return {
    spec,
    node,
    mount() {
      chart = new LineChart(canvas, [], { title: spec.title, yLabel: spec.y, emptyText: spec.empty,
        yFormat: spec.format || formatNumber });
    },
    /** Draw the runs; returns whether any run has a point of this panel's field. */
    update(runs, { weight, xField, log, xMax }) {
      const fmt = spec.format || formatNumber;
      const series = [];
      const drawn = [];
      for (const run of runs) {
        if (!run.job) continue;
        const color = runColor(run.index);
        const { xs, ys } = curve(run, spec.field, xField);
        const w = weightFor(xs.length, weight);
        const smooth = ema(ys, w);
        const markers = xs.length <= MARKERS_UP_TO;
        if (w > 0) {
          series.push(new Series({ name: `${run.label} raw`, key: `${run.id}-raw`, color, faint: true }));
          series[series.length - 1].setData(xs, ys);
        }
        const s = new Series({ name: run.label, key: run.id, color, markers,
          detail: w > 0 ? (i) => ` (raw ${fmt(ys[i])})` : undefined });
        s.setData(xs, smooth);
        series.push(s);
        drawn.push({ id: run.id, xs, raw: ys, smoothed: smooth, weight: w });
      }
      // what is drawn, for tests and the curious (not serialised into the DOM: it can be long)
      canvas.drawn = drawn;
      canvas.dataset.smoothing = String(weight);
      canvas.dataset.xField = xField;
      const axis = X_AXES[xField];
      chart.set({ log: spec.y === "loss" && log, xLabel: axis.label, xFormat: axis.format, xTime: axis.time,
        xMax: xField === "step" ? xMax : 0 });
      chart.setSeries(series);
      return drawn.some((d) => d.xs.length > 0);
    },
    destroy() { chart?.destroy(); },
  };
}

/** A group of panels under a heading; update() hides the charts no run has a point for, and the
 *  whole grid (saying so) when no run has any. */
function metricGroup({ key, title, empty, specs }) {
  const panels = specs.map((spec) => panel({ ...spec, empty: `no ${spec.title.toLowerCase()} recorded for these runs` }));
  const grid = el("div", { class: specs.length === 3 ? "grid-3" : "grid-2" }, panels.map((p) => p.node));
  const none = el("p", { class: "muted cmp-empty", id: `cmp-no-${key}`, hidden: true }, empty);
  const node = el("section", { class: "cmp-group", id: `cmp-${key}`, "aria-labelledby": `cmp-${key}-h` },
    el("div", { class: "card-head" }, el("h2", { id: `cmp-${key}-h` }, title)), none, grid);
  return {
    node,
    panels,
    update(runs, options) {
      const has = panels.map((p) => p.update(runs, options));
      panels.forEach((p, i) => { p.node.hidden = !has[i]; });
      const some = has.some(Boolean);
      none.hidden = some;
      grid.hidden = !some;
      node.dataset.state = some ? "charts" : "empty";
    },
  };
}

/** The loss group, the accuracy group (which says so when no run recorded any accuracy), then the
 *  training dynamics and the system (GROUPS). */
export function comparePanels() {
  const groups = GROUPS.map(metricGroup);
  const lossPanels = PANELS.map(panel);
  const panels = [...lossPanels, ...groups.flatMap((g) => g.panels)];
  const [trainLoss, valLoss, trainAcc, valAcc] = lossPanels;
  const accuracyCharts = el("div", { class: "grid-2" }, trainAcc.node, valAcc.node);
  const noAccuracy = el("p", { class: "muted cmp-empty", id: "cmp-no-accuracy", hidden: true },
    "no accuracy recorded for these runs");
  const logToggle = el("input", { type: "checkbox", id: "cmp-log" });
  const loss = el("section", { class: "cmp-group", "aria-labelledby": "cmp-loss-h" },
    el("div", { class: "card-head" }, el("h2", { id: "cmp-loss-h" }, "Loss"),
      el("label", { class: "toggle", for: "cmp-log" }, logToggle, " Log scale")),
    el("div", { class: "grid-2" }, trainLoss.node, valLoss.node));
  const accuracy = el("section", { class: "cmp-group", id: "cmp-accuracy", "aria-labelledby": "cmp-accuracy-h" },
    el("div", { class: "card-head" }, el("h2", { id: "cmp-accuracy-h" }, "Token accuracy")),
    noAccuracy, accuracyCharts);
  return {
    nodes: [loss, accuracy, ...groups.map((g) => g.node)],
    mount(onChange) {
      panels.forEach((p) => p.mount());
      logToggle.addEventListener("change", onChange);
    },
    /** runs: Run[]; settings: {weight, xField}. */
    update(runs, settings) {
      const xMax = Math.max(0, ...runs.map((r) => (r.job && r.job.progress && r.job.progress.total_steps) || 0));
      const options = { ...settings, log: logToggle.checked, xMax };
      trainLoss.update(runs, options);
      valLoss.update(runs, options);
      const some = [trainAcc.update(runs, options), valAcc.update(runs, options)].some(Boolean);
      noAccuracy.hidden = some;
      accuracyCharts.hidden = !some;
      accuracy.dataset.state = some ? "charts" : "empty";
      for (const g of groups) g.update(runs, options);
    },
    destroy() { panels.forEach((p) => p.destroy()); },
  };
}
