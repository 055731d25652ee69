// The job's charts, as W&B lays them out: loss (train and val, optional log scale) large, then the
// training dynamics (learning rate, gradient norm, tokens/s) and the system (CPU and device use,
// memory) small, all against one x axis the user picks: step, tokens seen or wall-clock time since
// the first point. Nothing is smoothed: the val series (a few evaluations) shows its points.
// Client-side data are bounded (MAX_POINTS), so a long job cannot grow the page's memory without end.

import { LineChart, Series, formatCompact, formatNumber } from "../../chart.js";
import { el } from "../../util.js";
import { X_AXES, pointX, xAxisSelect } from "../x_axis.js";

const MAX_POINTS = 2000; // per series, and points kept for redrawing on another axis (twice that)

/** Learning rates as "1e-3", "2.5e-4": one notation on the whole axis. */
function fmtLr(v) {
  if (v === 0) return "0";
  const [m, e] = v.toExponential(2).split("e");
  return `${+m}e${+e}`;
}
const fmtBytes = (v) => `${formatCompact(v)}B`;
const fmtPercent = (v) => `${formatNumber(v)}%`;

// field -> series; colours follow the loss chart's (train blue, val orange)
const SERIES = {
  train_loss: { name: "train loss", color: "#2563eb" },
  val_loss: { name: "val loss", color: "#ea580c", markers: true },
  lr: { name: "learning rate", color: "#059669" },
  grad_norm: { name: "grad norm", color: "#7c3aed" },
  tokens_per_s: { name: "tokens/s", color: "#0891b2" },
  cpu_percent: { name: "process CPU", color: "#2563eb" },
  gpu_utilization: { name: "device utilization", color: "#db2777" },
  rss_bytes: { name: "process RSS", color: "#2563eb" },
  gpu_memory_bytes: { name: "device memory", color: "#db2777" },
  peak_memory_bytes: { name: "peak memory", color: "#ca8a04", dashed: true },
};

// the charts: id, title, y label and format, the fields it draws, and whether it is small
const CHARTS = [
  { id: "loss-chart", title: "Loss", y: "loss", fields: ["train_loss", "val_loss"], large: true },
  { id: "lr-chart", title: "Learning rate", y: "lr", fields: ["lr"], format: fmtLr },
  { id: "grad-norm-chart", title: "Gradient norm", y: "norm", fields: ["grad_norm"] },
  { id: "tps-chart", title: "Tokens/s", y: "tokens/s", fields: ["tokens_per_s"], format: formatCompact },
  { id: "cpu-chart", title: "CPU and device use", y: "%", fields: ["cpu_percent", "gpu_utilization"], format: fmtPercent,
    empty: "no system metrics recorded" },
  { id: "memory-chart", title: "Memory", y: "bytes", fields: ["rss_bytes", "gpu_memory_bytes", "peak_memory_bytes"],
    format: fmtBytes, empty: "no memory metrics recorded" },
];

/** A swatch coloured through the CSSOM: a style attribute is inline style, which the CSP refuses. */
function swatch(color) {
  const node = el("span", { class: "swatch" });
  node.style.background = color;
  return node;
}

// what a chart with no points says once the job has ended (no point will come): by how it ended
const NO_POINTS = {
  failed: "no metrics: the job failed before its first step",
  cancelled: "no metrics: the job was cancelled before its first step",
};
const NO_POINTS_OTHERWISE = "no metrics were recorded";

const legend = (series) => el("ul", { class: "legend" }, series.map((s) => el("li", {}, swatch(s.color), s.name)));

const value = (m, field) => (field === "val_loss" ? m.val_loss ?? m.valid_loss : m[field]);

/** Halve the points kept, keeping the first, the last and every evaluation. */
function thin(points) {
  const kept = points.filter((m, i) => i % 2 === 0 || i === points.length - 1 || value(m, "val_loss") != null);
  points.splice(0, points.length, ...kept);
}

function chartCard(spec, series, extra) {
  const canvas = el("canvas", { id: spec.id, class: spec.large ? "chart" : "chart chart-small", role: "img",
    "aria-label": `${spec.title} chart` });
  const h = `${spec.id}-h`;
  const node = el("section", { class: "card chart-card", "aria-labelledby": h },
    el("div", { class: "card-head" }, el("h2", { id: h }, spec.title), legend(series), extra), canvas);
  return { spec, series, canvas, node, chart: null };
}

const lineChart = (c) => new LineChart(c.canvas, c.series, { yLabel: c.spec.y, title: `${c.spec.title} chart`,
  log: false, yFormat: c.spec.format || formatNumber, ...(c.spec.empty ? { emptyText: c.spec.empty } : {}) });

/** The job has ended with `status`: the charts still without points say there is no data, not
 *  "waiting" (the system charts keep their own words). */
function sayNoPoints(cards, status) {
  const text = NO_POINTS[status] || NO_POINTS_OTHERWISE;
  for (const c of cards) if (!c.spec.empty && c.chart?.options.emptyText !== text) c.chart?.set({ emptyText: text });
}

/** The chart cards; call mount() once they are in the document (the charts measure their canvas). */
export function jobCharts() {
  const series = Object.fromEntries(Object.entries(SERIES).map(([field, s]) =>
    [field, new Series({ ...s, key: s.name, max: MAX_POINTS })]));
  const logToggle = el("input", { type: "checkbox", id: "log-scale" });
  const axis = xAxisSelect("x-axis");
  const cards = CHARTS.map((spec) => chartCard(spec, spec.fields.map((f) => series[f]), spec.large
    ? el("div", { class: "chart-tools" }, axis.node, el("label", { class: "toggle", for: "log-scale" }, logToggle, " Log scale"))
    : null));
  const points = []; // what was drawn, for another x axis: {step, tokens_seen, created_at, ...}
  let total = 0;

  function push(m) {
    const x = pointX(m, axis.value(), points[0]);
    if (x === undefined) return;
    for (const [field, s] of Object.entries(series)) {
      const v = value(m, field);
      if (v !== null && v !== undefined) s.push(x, v);
      else if (field === "val_loss" && x <= s.lastX) s.truncate(x); // a resumed job: drop val points from here on
    }
  }
  function redraw() {
    for (const s of Object.values(series)) s.clear();
    for (const m of points) push(m);
    const a = X_AXES[axis.value()];
    for (const c of cards) c.chart.set({ xLabel: a.label, xFormat: a.format, xTime: a.time, xMax: a.time || axis.value() !== "step" ? 0 : total });
  }
  const [lossCard, lrCard, ...rest] = cards.map((c) => c.node);
  return {
    lossCard,
    lrCard,
    dynamicsCards: rest.slice(0, 2),
    systemCards: rest.slice(2),
    mount() {
      for (const c of cards) c.chart = lineChart(c);
      logToggle.addEventListener("change", () => cards[0].chart.set({ log: logToggle.checked }));
      axis.onChange(redraw);
      redraw();
    },
    /** One metrics point (as /metrics and the stream's `metrics` event give it). */
    add(m) {
      while (points.length && points[points.length - 1].step >= m.step) points.pop(); // re-reported or resumed
      points.push(m);
      if (points.length > 2 * MAX_POINTS) thin(points);
      push(m);
    },
    draw() { for (const c of cards) c.chart.draw(); },
    ended: (status) => sayNoPoints(cards, status), // the job ended with `status`
    setTotalSteps(steps) {
      if (steps === total) return;
      total = steps;
      if (axis.value() === "step") for (const c of cards) c.chart.set({ xMax: total });
    },
    lastTrainLoss: () => (series.train_loss.length ? series.train_loss.lastY : undefined),
    lastValLoss: () => (series.val_loss.length ? series.val_loss.lastY : undefined),
    destroy() { for (const c of cards) c.chart?.destroy(); },
  };
}
