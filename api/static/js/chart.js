// A small line chart on <canvas>: several series against a shared x axis (steps), linear or log
// y axis, "nice" ticks, a hover read-out, crisp on high-DPI screens. Series hold bounded arrays
// (Series.max points, halved by min/max decimation when full) so a 100,000-step job stays smooth.
// A series may be `faint` (thin and translucent, behind the others: a raw curve under its smoothed
// one; left out of the read-out) and may add a `detail(i)` text to its read-out line.
// The pieces: chart/scale.js (extent, ticks, the plot's frame), chart/paint.js (painting a frame).

import { paintAxes, paintEmpty, paintReadout, paintSeries, readoutAt, readoutTexts } from "./chart/paint.js";
import { chartFrame, dataExtent, formatCompact, formatElapsed, formatNumber, lowerBound } from "./chart/scale.js";

export { formatCompact, formatElapsed, formatNumber, lowerBound };

export class Series {
  constructor({ name, color, max = 2000, markers = false, dashed = false, faint = false, key, detail }) {
    // key: names its data-points-<key> attribute (default: the name)
    Object.assign(this, { name, color, max, markers, dashed, faint, key: key || name, detail });
    this.xs = [];
    this.ys = [];
  }

  get length() { return this.xs.length; }
  get lastX() { return this.xs.length ? this.xs[this.xs.length - 1] : -Infinity; }
  get lastY() { return this.ys.length ? this.ys[this.ys.length - 1] : null; }

  clear() { this.xs = []; this.ys = []; }

  /** Replace all points (xs increasing; no decimation: the caller bounds them). */
  setData(xs, ys) { this.xs = xs; this.ys = ys; }

  /** Drop the points at x and after. */
  truncate(x) {
    const i = lowerBound(this.xs, x);
    this.xs.length = i;
    this.ys.length = i;
  }

  /** Add a point in x order. A point at or before the last x replaces the tail from there
   *  (a resumed job re-reports the steps after its checkpoint). */
  push(x, y) {
    if (y === null || y === undefined || !Number.isFinite(y)) return;
    if (x <= this.lastX) this.truncate(x);
    this.xs.push(x);
    this.ys.push(y);
    if (this.xs.length > this.max) this.compact();
  }

  /** Halve the point count: per bucket of 4 points keep the min and the max (in x order), so
   *  spikes survive; the first and the last points are always kept. */
  compact() {
    const n = this.xs.length;
    const xs = [this.xs[0]], ys = [this.ys[0]];
    for (let i = 1; i < n - 1; i += 4) {
      const end = Math.min(i + 4, n - 1);
      let lo = i, hi = i;
      for (let j = i + 1; j < end; j++) {
        if (this.ys[j] < this.ys[lo]) lo = j;
        if (this.ys[j] > this.ys[hi]) hi = j;
      }
      for (const j of lo === hi ? [lo] : lo < hi ? [lo, hi] : [hi, lo]) { xs.push(this.xs[j]); ys.push(this.ys[j]); }
    }
    xs.push(this.xs[n - 1]);
    ys.push(this.ys[n - 1]);
    this.xs = xs;
    this.ys = ys;
  }
}

const pointsAttribute = (s) => `data-points-${s.key.replace(/\W+/g, "-")}`;

export class LineChart {
  /**
   * canvas: the <canvas>; series: Series[]; options: {xLabel, yLabel, yFormat, xFormat, xTime (round
   * seconds as x ticks: a wall-clock axis), log, xMax, emptyText}
   * The canvas gets data-empty (the emptyText, while nothing is drawn), data-points (points drawn,
   * all series) and data-points-<series key> attributes
   * (e.g. data-points-train-loss), data-x-ticks (the x tick labels, "|"-separated) and
   * data-x-labels-fit (whether the last x label ends inside the canvas), and while the pointer is over it data-readout (the read-out's
   * lines, newline-separated).
   */
  constructor(canvas, series, options = {}) {
    this.canvas = canvas;
    this.series = series;
    this.options = { xLabel: "step", yLabel: "", log: false, xMax: 0, yFormat: formatNumber,
      emptyText: "waiting for the first data points…", ...options };
    this.hoverX = null;
    this.pending = false;
    this.destroyed = false;
    this.resizeObserver = new ResizeObserver(() => this.draw());
    this.resizeObserver.observe(canvas);
    this.onMove = (ev) => {
      const r = canvas.getBoundingClientRect();
      this.hoverX = ev.clientX - r.left;
      this.draw();
    };
    this.onLeave = () => { this.hoverX = null; this.draw(); };
    canvas.addEventListener("pointermove", this.onMove);
    canvas.addEventListener("pointerleave", this.onLeave);
    this.draw();
  }

  destroy() {
    this.destroyed = true;
    this.resizeObserver.disconnect();
    this.canvas.removeEventListener("pointermove", this.onMove);
    this.canvas.removeEventListener("pointerleave", this.onLeave);
  }

  set(options) { Object.assign(this.options, options); this.draw(); }

  /** Draw these series from now on (the data-points attributes of the ones left out go). */
  setSeries(series) {
    const kept = new Set(series.map((s) => s.key));
    for (const s of this.series) if (!kept.has(s.key)) this.canvas.removeAttribute(pointsAttribute(s));
    this.series = series;
    this.draw();
  }

  /** Schedule a redraw on the next animation frame (many updates → one paint). */
  draw() {
    if (this.pending || this.destroyed) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; if (!this.destroyed) this.paint(); });
  }

  colors() {
    const css = getComputedStyle(this.canvas);
    const v = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
    return { text: v("--chart-text", "#333"), grid: v("--chart-grid", "#e3e6ea"), axis: v("--chart-axis", "#888"),
      bg: v("--chart-bg", "#fff"), tip: v("--chart-tip", "rgba(255,255,255,0.95)"),
      faint: Number(v("--chart-faint", "0.28")) || 0.28 };
  }

  paint() {
    const surface = this.#prepareSurface();
    if (!surface) return;
    const { ctx, colors } = surface;
    const { log, emptyText } = this.options;
    const usable = (y) => Number.isFinite(y) && (!log || y > 0);
    const extent = dataExtent(this.series, usable);
    this.#reportPoints(extent.total);
    if (!(extent.xMax >= extent.xMin)) {
      paintEmpty(ctx, colors, surface, emptyText);
      this.canvas.dataset.empty = emptyText; // what the empty chart says, for tests and readers
      this.canvas.setAttribute("aria-label", `${this.options.title || "chart"}: ${emptyText}`);
      return;
    }
    delete this.canvas.dataset.empty;
    const frame = chartFrame(ctx, extent, surface, this.options);
    if (!frame) return;
    const xAxis = paintAxes(ctx, frame, colors, this.options);
    this.canvas.dataset.xTicks = xAxis.labels.join("|"); // what the x axis reads, for tests
    this.canvas.dataset.xLabelsFit = String(xAxis.right <= surface.width); // no label cut at the edge
    paintSeries(ctx, this.series, frame, colors, usable);
    const readout = readoutAt(this.series, frame, this.hoverX);
    if (readout) {
      const texts = readoutTexts(readout, this.options);
      this.canvas.dataset.readout = texts.join("\n");
      paintReadout(ctx, frame, colors, readout, texts, usable);
    }
    this.#describe(extent.total);
  }

  /** Size the backing store for the screen's pixel ratio and clear it; null while the canvas is
   *  not laid out. width and height are in CSS pixels. */
  #prepareSurface() {
    const canvas = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const width = canvas.clientWidth, height = canvas.clientHeight;
    if (!width || !height) return null;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(height * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const colors = this.colors();
    ctx.fillStyle = colors.bg;
    ctx.fillRect(0, 0, width, height);
    ctx.font = "12px system-ui, -apple-system, Segoe UI, Roboto, sans-serif";
    return { ctx, colors, width, height };
  }

  /** The data-points attributes; the read-out is set again only if the pointer still shows one. */
  #reportPoints(total) {
    this.canvas.dataset.points = String(total);
    for (const s of this.series) this.canvas.setAttribute(pointsAttribute(s), String(s.length));
    delete this.canvas.dataset.readout;
  }

  /** The canvas's accessible name: the points drawn and each series' latest value. */
  #describe(total) {
    const { xLabel, yFormat } = this.options;
    const summary = this.series.filter((s) => s.length && !s.faint)
      .map((s) => `${s.name} ${yFormat(s.lastY)} at ${xLabel || "x"} ${(this.options.xFormat || formatNumber)(s.lastX)}`).join(", ");
    this.canvas.setAttribute("aria-label", `${this.options.title || "chart"}: ${total} points; latest ${summary}`);
  }
}
