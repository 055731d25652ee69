// The models a job has produced (its final model, then its checkpoints newest first), and the
// <select> that offers them to the generate and download cards.

import { clear, el } from "../../util.js";
import { newestFirst } from "./checkpoints.js";

/** [[model id, label], ...]: the final model first, then each checkpoint's model. */
export function jobModels(job, checkpoints) {
  const ids = [];
  if (job && job.fine_tuned_model) ids.push([job.fine_tuned_model, "final model"]);
  for (const c of newestFirst(checkpoints)) {
    if (c.fine_tuned_model_checkpoint && !ids.some(([mid]) => mid === c.fine_tuned_model_checkpoint)) {
      ids.push([c.fine_tuned_model_checkpoint, `checkpoint step ${c.step_number}`]);
    }
  }
  return ids;
}

/** A select that keeps what the user picked across refills; otherwise it shows the newest model. */
export function modelSelect(id) {
  const sel = el("select", { id, name: id });
  sel.addEventListener("change", () => { sel.dataset.chosen = sel.value; });
  return sel;
}

export function fillModelSelect(sel, models) {
  const keep = sel.dataset.chosen;
  clear(sel, models.length ? models.map(([mid, label]) => el("option", { value: mid }, `${label} — ${mid}`))
    : el("option", { value: "" }, "no model yet (waiting for a checkpoint)"));
  if (models.some(([mid]) => mid === keep)) sel.value = keep;
}
