// The charts' x axis: step, tokens seen or wall-clock time (seconds since the run's first point),
// chosen in a select and remembered in this browser. Shared by the job page and the compare view.

import { formatCompact, formatElapsed, formatNumber } from "../chart.js";
import { el } from "../util.js";

const STORE = "fromscratch.xAxis";

export const X_AXES = {
  step: { label: "step", title: "Step", format: formatNumber, time: false },
  tokens_seen: { label: "tokens seen", title: "Tokens", format: formatCompact, time: false },
  time: { label: "wall-clock time", title: "Wall-clock time", format: formatElapsed, time: true },
};

/** A point's x on `axis` (undefined when it has none); `first`: the run's first point (time 0). */
export function pointX(m, axis, first) {
  if (axis === "time") {
    const t0 = first?.created_at;
    return typeof m.created_at === "number" && typeof t0 === "number" ? m.created_at - t0 : undefined;
  }
  const x = m[axis];
  return typeof x === "number" && Number.isFinite(x) ? x : undefined;
}

export function rememberedAxis(fallback = "step") {
  try { const v = localStorage.getItem(STORE); return v in X_AXES ? v : fallback; } catch { return fallback; }
}

export function rememberAxis(axis) {
  try { localStorage.setItem(STORE, axis); } catch { /* private mode */ }
}

/** A labelled select of the axes; onChange(fn) calls fn(axis) after the user picks one. */
export function xAxisSelect(id) {
  const select = el("select", { id }, Object.entries(X_AXES).map(([v, a]) => el("option", { value: v }, a.title)));
  select.value = rememberedAxis();
  const node = el("span", { class: "x-axis" }, el("label", { for: id }, "X axis "), select);
  return {
    node,
    value: () => select.value,
    onChange(fn) { select.addEventListener("change", () => { rememberAxis(select.value); fn(select.value); }); },
  };
}
