// The comparison's settings: the smoothing weight (a slider from 0 to 0.99, as in TensorBoard) and
// the x axis (step, tokens seen or wall-clock time). Both are remembered in this browser.

import { el } from "../../util.js";

const STORE = "fromscratch.compare";
const DEFAULTS = { weight: 0.6, xField: "step" };

function remembered() {
  try {
    const saved = JSON.parse(localStorage.getItem(STORE) || "{}");
    const weight = Number(saved.weight);
    return {
      weight: Number.isFinite(weight) && weight >= 0 && weight <= 0.99 ? weight : DEFAULTS.weight,
      xField: ["tokens_seen", "time"].includes(saved.xField) ? saved.xField : DEFAULTS.xField,
    };
  } catch {
    return { ...DEFAULTS };
  }
}

/** onChange(settings) after every change; settings(): {weight, xField}. */
export function compareControls(onChange) {
  const start = remembered();
  const slider = el("input", { type: "range", id: "cmp-smoothing", min: 0, max: 0.99, step: 0.01,
    value: start.weight, "aria-describedby": "cmp-smoothing-help" });
  const shown = el("output", { for: "cmp-smoothing", id: "cmp-smoothing-value", class: "mono" }, start.weight.toFixed(2));
  const xAxis = el("select", { id: "cmp-x" },
    el("option", { value: "step" }, "step"), el("option", { value: "tokens_seen" }, "tokens seen"),
    el("option", { value: "time" }, "wall-clock time"));
  xAxis.value = start.xField;
  const node = el("div", { class: "card cmp-controls" },
    el("div", { class: "cmp-control cmp-smoothing" },
      el("label", { for: "cmp-smoothing" }, "Smoothing"), slider, shown,
      el("span", { id: "cmp-smoothing-help", class: "help", hidden: true },
        "Exponential moving average of each curve (debiased); the raw curve stays faint behind it. "
        + "A curve of fewer than 10 points (a few evaluations) is never smoothed.")),
    el("div", { class: "cmp-control" }, el("label", { for: "cmp-x" }, "X axis"), xAxis));

  const settings = () => ({ weight: Number(slider.value), xField: xAxis.value });
  const changed = () => {
    shown.textContent = Number(slider.value).toFixed(2);
    try { localStorage.setItem(STORE, JSON.stringify(settings())); } catch { /* private mode */ }
    onChange(settings());
  };
  slider.addEventListener("input", changed);
  xAxis.addEventListener("change", changed);
  return { node, settings };
}
