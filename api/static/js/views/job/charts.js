// The loss chart (train and val, optional log scale) and the learning-rate chart. Client-side
// series are bounded (Series.max), so a long job cannot grow the page's memory without end.

import { LineChart, Series } from "../../chart.js";
import { el } from "../../util.js";

const MAX_POINTS = 2000; // per series, client side

/** Learning rates as "1e-3", "2.5e-4": one notation on the whole axis. */
function fmtLr(v) {
  if (v === 0) return "0";
  const [m, e] = v.toExponential(2).split("e");
  return `${+m}e${+e}`;
}

const legend = (series) => el("ul", { class: "legend" }, series.map((s) =>
  el("li", {}, el("span", { class: "swatch", style: `background:${s.color}` }), s.name)));

/** The two chart cards; call mount() once they are in the document (the charts measure their canvas). */
export function jobCharts() {
  const train = new Series({ name: "train loss", color: "#2563eb", max: MAX_POINTS });
  const val = new Series({ name: "val loss", color: "#ea580c", max: MAX_POINTS, markers: true });
  const lr = new Series({ name: "learning rate", color: "#059669", max: MAX_POINTS });

  const lossCanvas = el("canvas", { id: "loss-chart", class: "chart", role: "img", "aria-label": "Loss chart" });
  const lrCanvas = el("canvas", { id: "lr-chart", class: "chart chart-small", role: "img", "aria-label": "Learning-rate chart" });
  const logToggle = el("input", { type: "checkbox", id: "log-scale" });
  const lossCard = el("section", { class: "card chart-card", "aria-labelledby": "loss-h" },
    el("div", { class: "card-head" }, el("h2", { id: "loss-h" }, "Loss"), legend([train, val]),
      el("label", { class: "toggle", for: "log-scale" }, logToggle, " Log scale")),
    lossCanvas);
  const lrCard = el("section", { class: "card chart-card", "aria-labelledby": "lr-h" },
    el("div", { class: "card-head" }, el("h2", { id: "lr-h" }, "Learning rate"), legend([lr])), lrCanvas);

  let lossChart = null, lrChart = null;
  return {
    lossCard,
    lrCard,
    mount() {
      lossChart = new LineChart(lossCanvas, [train, val], { yLabel: "loss", title: "Loss chart", log: false });
      lrChart = new LineChart(lrCanvas, [lr], { yLabel: "lr", title: "Learning-rate chart", yFormat: fmtLr });
      logToggle.addEventListener("change", () => lossChart.set({ log: logToggle.checked }));
    },
    /** One metrics point (as /metrics and the stream's `metrics` event give it). */
    add(m) {
      train.push(m.step, m.train_loss);
      lr.push(m.step, m.lr);
      const v = m.val_loss ?? m.valid_loss;
      if (v !== null && v !== undefined) val.push(m.step, v);
      else if (m.step <= val.lastX) val.truncate(m.step); // a resumed job: drop val points from here on
    },
    draw() { lossChart.draw(); lrChart.draw(); },
    setTotalSteps(total) { lossChart.set({ xMax: total }); lrChart.set({ xMax: total }); },
    lastTrainLoss: () => (train.length ? train.lastY : undefined),
    lastValLoss: () => (val.length ? val.lastY : undefined),
    destroy() { lossChart?.destroy(); lrChart?.destroy(); },
  };
}
