// The runs being compared, as the charts' legend: colour, name (a link to the job), model, status,
// progress and last losses; a button takes a run out of the comparison.

import { badge, clear, el, fmtInt, fmtLoss } from "../../util.js";

/** onRemove(run) when a run's remove button is pressed. */
export function runsLegend(onRemove) {
  const body = el("tbody", {});
  const node = el("section", { class: "card", "aria-labelledby": "cmp-runs-h" },
    el("h2", { id: "cmp-runs-h" }, "Runs"),
    el("div", { class: "table-wrap" }, el("table", { class: "table cmp-runs", id: "cmp-runs" },
      el("thead", {}, el("tr", {}, ["Run", "Model", "Status", "Step", "Train loss", "Val loss", ""]
        .map((h) => el("th", { scope: "col" }, h)))),
      body)));
  let shown = "";

  function row(run) {
    const job = run.job;
    const p = (job && job.progress) || {};
    const remove = el("button", { type: "button", class: "link cmp-remove", title: `Remove ${run.label} from the comparison`,
      "aria-label": `Remove ${run.label} from the comparison`, onclick: () => onRemove(run) }, "✕");
    const name = el("th", { scope: "row" },
      el("span", { class: "swatch", style: `background:${run.cssColor}` }), " ",
      el("a", { href: `#/jobs/${encodeURIComponent(run.id)}`, class: "mono" }, run.label));
    if (!job) {
      return el("tr", { dataset: { jobId: run.id } }, name,
        el("td", { colspan: 5, class: "error-text" }, run.error || "loading…"), el("td", {}, remove));
    }
    return el("tr", { dataset: { jobId: run.id, status: job.status } }, name,
      el("td", {}, job.model || "—"),
      el("td", {}, badge(job.status)),
      el("td", { class: "num" }, p.total_steps ? `${fmtInt(p.step)} / ${fmtInt(p.total_steps)}` : fmtInt(p.step)),
      el("td", { class: "num" }, fmtLoss(p.train_loss)),
      el("td", { class: "num" }, fmtLoss(p.val_loss)),
      el("td", {}, remove));
  }

  return {
    node,
    /** Rebuilt only when something shown changed, so a focused button is not replaced under the user. */
    render(runs) {
      const state = JSON.stringify(runs.map((r) => [r.id, r.label, r.error, r.job && r.job.status, r.job && r.job.progress]));
      if (state === shown) return;
      shown = state;
      clear(body, runs.map(row));
    },
  };
}
