// Painting one frame of the chart on its 2D context, in this order: the grid with its tick labels,
// the series (faint ones first, clipped to the plot area), then the hover read-out.
// frame: chartFrame() (scale.js); colors: LineChart.colors(); usable(y): whether y can be drawn.

import { formatNumber, lowerBound } from "./scale.js";

export function paintEmpty(ctx, colors, { width, height }, text) {
  ctx.fillStyle = colors.axis;
  ctx.textAlign = "center";
  ctx.textBaseline = "middle";
  ctx.fillText(text, width / 2, height / 2);
}

/** The grid lines, their tick labels, the plot's border and the axis labels; returns the x tick
 *  labels and the right edge of the last one (CSS pixels), for the chart's data attributes. */
export function paintAxes(ctx, frame, colors, { xLabel, yLabel, yFormat, log, xFormat = formatNumber }) {
  const { m, W, H, fx, fy } = frame;
  ctx.lineWidth = 1;
  ctx.strokeStyle = colors.grid;
  ctx.fillStyle = colors.text;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const t of frame.yTicks) {
    const y = Math.round(fy(t)) + 0.5;
    ctx.beginPath(); ctx.moveTo(m.l, y); ctx.lineTo(m.l + W, y); ctx.stroke();
    ctx.fillText(yFormat(t), m.l - 6, y);
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  const labels = [];
  let right = 0;
  for (const t of frame.xTicks) {
    const x = Math.round(fx(t)) + 0.5;
    ctx.beginPath(); ctx.moveTo(x, m.t); ctx.lineTo(x, m.t + H); ctx.stroke();
    const label = xFormat(t);
    ctx.fillText(label, x, m.t + H + 6);
    labels.push(label);
    right = Math.max(right, x + ctx.measureText(label).width / 2);
  }
  ctx.strokeStyle = colors.axis;
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
  return { labels, right };
}

/** One series' line, broken where a value cannot be drawn, and its markers. */
function paintLine(ctx, s, { fx, fy }, colors, usable) {
  ctx.globalAlpha = s.faint ? colors.faint : 1;
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

/** All series, the faint ones behind the others. */
export function paintSeries(ctx, series, frame, colors, usable) {
  const { m, W, H } = frame;
  ctx.save();
  ctx.beginPath();
  ctx.rect(m.l, m.t, W, H);
  ctx.clip();
  for (const s of [...series.filter((s) => s.faint), ...series.filter((s) => !s.faint)]) {
    if (!s.length) continue;
    paintLine(ctx, s, frame, colors, usable);
  }
  ctx.globalAlpha = 1;
  ctx.restore();
}

/** What the read-out shows with the pointer at hoverX: the nearest point of each series to the
 *  pointer's step (a series that ended well before it, or starts well after, is left out) and the
 *  step `at` of the nearest of those points. null when the pointer is off the plot or no series
 *  is near. */
export function readoutAt(series, frame, hoverX) {
  const { m, W, xMin, xMax } = frame;
  if (hoverX === null || hoverX < m.l || hoverX > m.l + W) return null;
  const step = xMin + ((hoverX - m.l) / W) * (xMax - xMin);
  const slack = (xMax - xMin) * 0.03;
  const lines = [];
  for (const s of series) {
    if (!s.length || s.faint || step > s.lastX + slack || step < s.xs[0] - slack) continue;
    let i = lowerBound(s.xs, step);
    if (i >= s.length || (i > 0 && step - s.xs[i - 1] < s.xs[i] - step)) i -= 1;
    if (i < 0) continue;
    lines.push({ s, i, x: s.xs[i], y: s.ys[i] });
  }
  if (!lines.length) return null;
  const at = lines.reduce((a, b) => (Math.abs(b.x - step) < Math.abs(a.x - step) ? b : a)).x;
  return { at, lines };
}

/** The read-out's text lines: the step, then each series' value (and detail). */
export function readoutTexts({ at, lines }, { xLabel, yFormat, xFormat = formatNumber }) {
  return [`${xLabel || "x"} ${xFormat(at)}`,
    ...lines.map((l) => `${l.s.name}: ${yFormat(l.y)}${l.s.detail ? l.s.detail(l.i) : ""}`)];
}

/** A dashed line at the read-out's step, a box with its texts and a dot on each point it names. */
export function paintReadout(ctx, frame, colors, { at, lines }, texts, usable) {
  const { m, W, H, fx, fy } = frame;
  const x = fx(at);
  ctx.strokeStyle = colors.axis;
  ctx.setLineDash([3, 3]);
  ctx.beginPath(); ctx.moveTo(x, m.t); ctx.lineTo(x, m.t + H); ctx.stroke();
  ctx.setLineDash([]);
  const w = Math.max(...texts.map((t) => ctx.measureText(t).width)) + 16, h = texts.length * 16 + 8;
  const bx = x + w + 12 > m.l + W ? x - w - 8 : x + 8;
  ctx.fillStyle = colors.tip;
  ctx.strokeStyle = colors.grid;
  ctx.fillRect(bx, m.t + 6, w, h);
  ctx.strokeRect(bx, m.t + 6, w, h);
  ctx.textAlign = "left";
  ctx.textBaseline = "top";
  texts.forEach((t, k) => {
    ctx.fillStyle = k === 0 ? colors.text : lines[k - 1].s.color;
    ctx.fillText(t, bx + 8, m.t + 10 + k * 16);
  });
  for (const l of lines) {
    if (!usable(l.y)) continue;
    ctx.fillStyle = l.s.color;
    ctx.beginPath(); ctx.arc(fx(l.x), fy(l.y), 4, 0, Math.PI * 2); ctx.fill();
  }
}
