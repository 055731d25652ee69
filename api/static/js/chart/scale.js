// The chart's scales: the data's extent, "nice" ticks (linear or log), the plot area inside its
// margins and the functions that map steps and values onto it.

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

// Wall-clock ticks: round numbers of seconds, minutes, hours or days.
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

function timeTicks(lo, hi, count) {
  const raw = (hi - lo) / Math.max(1, count);
  const step = TIME_STEPS.find((s) => s >= raw) ?? Math.ceil(raw / 86400) * 86400;
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9 && ticks.length < MAX_TICKS; v += step) ticks.push(v);
  return ticks;
}

/** Seconds as the time axis shows them: "45s", "12m", "12m30s", "1h05m", "2d3h". */
export function formatElapsed(v) {
  const s = Math.round(v);
  if (s < 60) return `${s}s`;
  if (s < 3600) return s % 60 ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s` : `${s / 60}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d${Math.floor((s % 86400) / 3600)}h`;
}

/** Large counts short: "950", "12k", "1.5M", "2.1B" (tokens). */
export function formatCompact(v) {
  const a = Math.abs(v);
  for (const [d, u] of [[1e9, "B"], [1e6, "M"], [1e3, "k"]]) if (a >= d) return `${+(v / d).toPrecision(3)}${u}`;
  return formatNumber(v);
}

export function formatNumber(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e6 || a < 1e-3) return v.toExponential(1).replace("e+", "e");
  if (a >= 1000) return Math.round(v).toLocaleString("en-US");
  return String(+v.toPrecision(3));
}

/** The bounds of the drawable points of all series (xMax < xMin when there are none) and the
 *  number of points they hold. usable(y): whether a value can be drawn. */
export function dataExtent(series, usable) {
  let xMin = Infinity, xMax = -Infinity, yMin = Infinity, yMax = -Infinity, total = 0;
  for (const s of series) {
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
  return { xMin, xMax, yMin, yMax, total };
}

/** The y range with some room above and below the data (a linear axis of values >= 0 stays >= 0). */
function paddedYRange(yMin, yMax, log) {
  if (log) {
    const pad = Math.pow(yMax / yMin, 0.05) || 1.1;
    yMin /= pad; yMax *= pad;
    if (yMax / yMin < 1.5) { const m = Math.sqrt(yMin * yMax); yMin = m / 1.25; yMax = m * 1.25; }
  } else {
    const dataMin = yMin, span = yMax - yMin || Math.abs(yMax) || 1;
    yMin -= span * 0.06; yMax += span * 0.06;
    if (yMin < 0 && dataMin >= 0) yMin = 0;
  }
  return [yMin, yMax];
}

/**
 * Where everything goes on a canvas of width x height (CSS pixels): the axes' ranges and ticks,
 * the margins m and the plot area W x H inside them, and fx/fy mapping a step/value to pixels.
 * null when the plot area would be too small to draw. options: the chart's options.
 */
export function chartFrame(ctx, extent, { width, height }, options) {
  const { log, xLabel, yLabel, yFormat, xFormat = formatNumber, xTime } = options;
  const xMin = Math.min(0, extent.xMin);
  const xMax = Math.max(extent.xMax, options.xMax || 0, xMin + 1);
  const [yMin, yMax] = paddedYRange(extent.yMin, extent.yMax, log);
  const yTicks = log ? logTicks(yMin, yMax) : linearTicks(yMin, yMax, Math.max(3, Math.floor(height / 50)));
  const xCount = Math.max(2, Math.floor(width / 90));
  const xTicks = (xTime ? timeTicks(xMin, xMax, xCount) : linearTicks(xMin, xMax, xCount)).filter((t) => t >= xMin);

  // margins: room for the widest y label, and for half the last x label past the plot's right edge
  // (it is centred on its tick, which may be the plot's last pixel: "2,000" must not lose its "0")
  let labelW = 0;
  for (const t of yTicks) labelW = Math.max(labelW, ctx.measureText(yFormat(t)).width);
  const lastX = xTicks.length ? ctx.measureText(xFormat(xTicks[xTicks.length - 1])).width : 0;
  const m = { l: Math.ceil(labelW) + (yLabel ? 26 : 12), r: Math.max(14, Math.ceil(lastX / 2) + 4), t: 10, b: xLabel ? 40 : 24 };
  const W = width - m.l - m.r, H = height - m.t - m.b;
  if (W < 20 || H < 20) return null;
  const fx = (x) => m.l + ((x - xMin) / (xMax - xMin)) * W;
  const ly = (y) => (log ? Math.log(y) : y);
  const lo = ly(yMin), hi = ly(yMax);
  const fy = (y) => m.t + H - ((ly(y) - lo) / (hi - lo)) * H;
  return { xMin, xMax, xTicks, yTicks, m, W, H, fx, fy };
}
