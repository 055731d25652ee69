// The checkpoints table, newest step first.

import { clear, el, fmtInt, fmtLoss, fmtTime } from "../../util.js";

const COLUMNS = ["Step", "Train loss", "Val loss", "Model id", "Created"];

export const newestFirst = (checkpoints) => checkpoints.slice().sort((a, b) => b.step_number - a.step_number);

function row(c) {
  const m = c.metrics || {};
  return el("tr", {},
    el("td", {}, fmtInt(c.step_number)),
    el("td", {}, fmtLoss(m.train_loss)),
    el("td", {}, fmtLoss(m.valid_loss ?? m.val_loss)),
    el("td", { class: "mono small" }, c.fine_tuned_model_checkpoint || "—"),
    el("td", {}, fmtTime(c.created_at)));
}

export function checkpointsCard() {
  const body = el("tbody");
  const node = el("section", { class: "card", "aria-labelledby": "ck-h" },
    el("h2", { id: "ck-h" }, "Checkpoints"),
    el("div", { class: "table-wrap" }, el("table", { class: "table", id: "checkpoints" },
      el("thead", {}, el("tr", {}, COLUMNS.map((h) => el("th", { scope: "col" }, h)))),
      body)));
  return {
    node,
    render(checkpoints) {
      const rows = newestFirst(checkpoints);
      clear(body, rows.length ? rows.map(row)
        : el("tr", {}, el("td", { colspan: COLUMNS.length, class: "muted" }, "No checkpoints yet.")));
    },
  };
}
