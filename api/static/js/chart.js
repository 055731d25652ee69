// A small line chart on <canvas>: several series against a shared x axis (steps), linear or log
// y axis, "nice" ticks, a hover read-out, crisp on high-DPI screens. Series hold bounded arrays
// (Series.max points, halved by min/max decimation when full) so a 100,000-step job stays smooth.
// A series may be `faint` (thin and translucent, behind the others: a raw curve under its smoothed
// one; left out of the read-out) and may add a `detail(i)` text to its read-out line.

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

export function lowerBound(arr, x) {
  let lo = 0, hi = arr.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (arr[mid] < x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

/** Round step for about `count` ticks over span: 1, 2 or 5 times a power of ten. */
function niceStep(span, count) {
  const raw = span / Math.max(1, count);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / p;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
}

const MAX_TICKS = 100;

function linearTicks(lo, hi, count) {
  // Two readings a float's resolution apart (a flat curve) make a span so small that adding the
  // step leaves v unchanged: the loop never ended and grew the array until "Invalid array length".
  // So the span is at least a billionth of the values, and the ticks are capped.
  const span = Math.max(hi - lo, Math.abs(hi) * 1e-9, Math.abs(lo) * 1e-9, 1e-12);
  const step = niceStep(span, count);
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9 && ticks.length < MAX_TICKS; v += step) {
    ticks.push(+v.toPrecision(12));
  }
  return ticks;
}

function logTicks(lo, hi) {
  // within a decade or so, evenly spaced round values read better than 1-2-5 (still placed on the log scale)
  if (hi / lo < 4) return linearTicks(lo, hi, 5);
  const a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi));
  const mults = b - a <= 1 ? [1, 1.5, 2, 3, 4, 5, 6, 8] : b - a <= 2 ? [1, 2, 5] : [1];
  const ticks = [];
  for (let e = a; e <= b; e++) {
    for (const m of mults) {
      const v = m * Math.pow(10, e);
      if (v >= lo * 0.999 && v <= hi * 1.001) ticks.push(+v.toPrecision(12));
    }
  }
  return ticks;
}

export function formatNumber(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e6 || a < 1e-3) return v.toExponential(1).replace("e+", "e");
  if (a >= 1000) return Math.round(v).toLocaleString("en-US");
  return String(+v.toPrecision(3));
}

export class LineChart {
  /**
   * canvas: the <canvas>; series: Series[]; options: {xLabel, yLabel, yFormat, log, xMax, emptyText}
   * The canvas gets data-points (points drawn, all series) and data-points-<series key> attributes
   * (e.g. data-points-train-loss), and while the pointer is over it data-readout (the read-out's
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
    const canvas = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const cssW = canvas.clientWidth, cssH = canvas.clientHeight;
    if (!cssW || !cssH) return;
    if (canvas.width !== Math.round(cssW * dpr) || canvas.height !== Math.round(cssH * dpr)) {
      canvas.width = Math.round(cssW * dpr);
      canvas.height = Math.round(cssH * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const c = this.colors();
    ctx.fillStyle = c.bg;
    ctx.fillRect(0, 0, cssW, cssH);
    ctx.font = "12px system-ui, -apple-system, Segoe UI, Roboto, sans-serif";

    const { log, xLabel, yLabel, yFormat, emptyText } = this.options;
    const usable = (y) => Number.isFinite(y) && (!log || y > 0);
    let xMin = Infinity, xMax = -Infinity, yMin = Infinity, yMax = -Infinity, total = 0;
    for (const s of this.series) {
      total += s.length;
      for (let i = 0; i < s.length; i++) {
        const y = s.ys[i];
        if (!usable(y)) continue;
        if (s.xs[i] < xMin) xMin = s.xs[i];
        if (s.xs[i] > xMax) xMax = s.xs[i];
        if (y < yMin) yMin = y;
        if (y > yMax) yMax = y;
      }
    }
    canvas.dataset.points = String(total);
    for (const s of this.series) canvas.setAttribute(pointsAttribute(s), String(s.length));
    delete canvas.dataset.readout;

    if (!(xMax >= xMin)) {
      ctx.fillStyle = c.axis;
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      ctx.fillText(emptyText, cssW / 2, cssH / 2);
      canvas.setAttribute("aria-label", `${this.options.title || "chart"}: no data yet`);
      return;
    }
    xMin = Math.min(0, xMin);
    xMax = Math.max(xMax, this.options.xMax || 0, xMin + 1);
    if (log) {
      const pad = Math.pow(yMax / yMin, 0.05) || 1.1;
      yMin /= pad; yMax *= pad;
      if (yMax / yMin < 1.5) { const m = Math.sqrt(yMin * yMax); yMin = m / 1.25; yMax = m * 1.25; }
    } else {
      const dataMin = yMin, span = yMax - yMin || Math.abs(yMax) || 1;
      yMin -= span * 0.06; yMax += span * 0.06;
      if (yMin < 0 && dataMin >= 0) yMin = 0;
    }
    const yTicks = log ? logTicks(yMin, yMax) : linearTicks(yMin, yMax, Math.max(3, Math.floor(cssH / 50)));
    const xTicks = linearTicks(xMin, xMax, Math.max(2, Math.floor(cssW / 90))).filter((t) => t >= xMin);

    // margins: room for the widest y label
    let labelW = 0;
    for (const t of yTicks) labelW = Math.max(labelW, ctx.measureText(yFormat(t)).width);
    const m = { l: Math.ceil(labelW) + (yLabel ? 26 : 12), r: 14, t: 10, b: xLabel ? 40 : 24 };
    const W = cssW - m.l - m.r, H = cssH - m.t - m.b;
    if (W < 20 || H < 20) return;
    const fx = (x) => m.l + ((x - xMin) / (xMax - xMin)) * W;
    const ly = (y) => (log ? Math.log(y) : y);
    const lo = ly(yMin), hi = ly(yMax);
    const fy = (y) => m.t + H - ((ly(y) - lo) / (hi - lo)) * H;

    // grid and tick labels
    ctx.lineWidth = 1;
    ctx.strokeStyle = c.grid;
    ctx.fillStyle = c.text;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const t of yTicks) {
      const y = Math.round(fy(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(m.l, y); ctx.lineTo(m.l + W, y); ctx.stroke();
      ctx.fillText(yFormat(t), m.l - 6, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (const t of xTicks) {
      const x = Math.round(fx(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, m.t); ctx.lineTo(x, m.t + H); ctx.stroke();
      ctx.fillText(formatNumber(t), x, m.t + H + 6);
    }
    ctx.strokeStyle = c.axis;
    ctx.strokeRect(m.l + 0.5, m.t + 0.5, W, H);
    if (xLabel) { ctx.fillText(xLabel, m.l + W / 2, m.t + H + 22); }
    if (yLabel) {
      ctx.save();
      ctx.translate(12, m.t + H / 2);
      ctx.rotate(-Math.PI / 2);
      ctx.textBaseline = "middle";
      ctx.fillText(yLabel + (log ? " (log)" : ""), 0, 0);
      ctx.restore();
    }

    // series
    ctx.save();
    ctx.beginPath();
    ctx.rect(m.l, m.t, W, H);
    ctx.clip();
    for (const s of [...this.series.filter((s) => s.faint), ...this.series.filter((s) => !s.faint)]) {
      if (!s.length) continue;
      ctx.globalAlpha = s.faint ? c.faint : 1;
      ctx.strokeStyle = s.color;
      ctx.fillStyle = s.color;
      ctx.lineWidth = s.faint ? 1.25 : 2;
      ctx.lineJoin = "round";
      ctx.setLineDash(s.dashed ? [6, 4] : []);
      ctx.beginPath();
      let pen = false;
      for (let i = 0; i < s.length; i++) {
        if (!usable(s.ys[i])) { pen = false; continue; }
        const x = fx(s.xs[i]), y = fy(s.ys[i]);
        if (pen) ctx.lineTo(x, y); else { ctx.moveTo(x, y); pen = true; }
      }
      ctx.stroke();
      ctx.setLineDash([]);
      if (s.markers || s.length === 1) {
        const r = s.length > 200 ? 1.5 : 3;
        for (let i = 0; i < s.length; i++) {
          if (!usable(s.ys[i])) continue;
          ctx.beginPath(); ctx.arc(fx(s.xs[i]), fy(s.ys[i]), r, 0, Math.PI * 2); ctx.fill();
        }
      }
    }
    ctx.globalAlpha = 1;
    ctx.restore();

    // hover read-out: nearest point of each series to the pointer's step (a series that ended
    // well before it, or starts well after, is left out), the line at the nearest of those points
    if (this.hoverX !== null && this.hoverX >= m.l && this.hoverX <= m.l + W) {
      const step = xMin + ((this.hoverX - m.l) / W) * (xMax - xMin);
      const slack = (xMax - xMin) * 0.03;
      const lines = [];
      for (const s of this.series) {
        if (!s.length || s.faint || step > s.lastX + slack || step < s.xs[0] - slack) continue;
        let i = lowerBound(s.xs, step);
        if (i >= s.length || (i > 0 && step - s.xs[i - 1] < s.xs[i] - step)) i -= 1;
        if (i < 0) continue;
        lines.push({ s, i, x: s.xs[i], y: s.ys[i] });
      }
      if (lines.length) {
        const at = lines.reduce((a, b) => (Math.abs(b.x - step) < Math.abs(a.x - step) ? b : a)).x;
        const x = fx(at);
        ctx.strokeStyle = c.axis;
        ctx.setLineDash([3, 3]);
        ctx.beginPath(); ctx.moveTo(x, m.t); ctx.lineTo(x, m.t + H); ctx.stroke();
        ctx.setLineDash([]);
        const texts = [`${xLabel || "x"} ${formatNumber(at)}`,
          ...lines.map((l) => `${l.s.name}: ${yFormat(l.y)}${l.s.detail ? l.s.detail(l.i) : ""}`)];
        canvas.dataset.readout = texts.join("\n");
        const w = Math.max(...texts.map((t) => ctx.measureText(t).width)) + 16, h = texts.length * 16 + 8;
        const bx = x + w + 12 > m.l + W ? x - w - 8 : x + 8;
        ctx.fillStyle = c.tip;
        ctx.strokeStyle = c.grid;
        ctx.fillRect(bx, m.t + 6, w, h);
        ctx.strokeRect(bx, m.t + 6, w, h);
        ctx.textAlign = "left";
        ctx.textBaseline = "top";
        texts.forEach((t, k) => {
          ctx.fillStyle = k === 0 ? c.text : lines[k - 1].s.color;
          ctx.fillText(t, bx + 8, m.t + 10 + k * 16);
        });
        for (const l of lines) {
          if (!usable(l.y)) continue;
          ctx.fillStyle = l.s.color;
          ctx.beginPath(); ctx.arc(fx(l.x), fy(l.y), 4, 0, Math.PI * 2); ctx.fill();
        }
      }
    }

    const summary = this.series.filter((s) => s.length && !s.faint)
      .map((s) => `${s.name} ${yFormat(s.lastY)} at ${xLabel || "x"} ${formatNumber(s.lastX)}`).join(", ");
    canvas.setAttribute("aria-label", `${this.options.title || "chart"}: ${total} points; latest ${summary}`);
  }
}
