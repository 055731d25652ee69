// The job page's Clone (the new-job form started from this job: #/new?clone=<id>) and, for a
// succeeded job's model, Delete model (DELETE /v1/models/{id}; a second click within 4 s confirms).
// The API deletes models and files, never jobs: a job stays in the list with its history.

import { el, toast } from "../../util.js";

const CONFIRM_MS = 4000;

/** deleteModel(id): DELETE /v1/models/{id}; onDeleted(id): the page forgets the model (a 404 too:
 *  it was gone already). */
export function modelActions({ jobId, deleteModel, onDeleted }) {
  const clone = el("a", { class: "button secondary", id: "btn-clone", href: `#/new?clone=${encodeURIComponent(jobId)}`,
    title: "Start a new job from this one's model, files and hyperparameters" }, "Clone");
  const remove = el("button", { type: "button", class: "danger", id: "btn-delete-model", hidden: true }, "Delete model");
  const node = el("div", { class: "controls", role: "group", "aria-label": "Clone the job, delete its model" },
    clone, remove);
  let model = null; // what Delete model deletes
  let armed = null; // the timer that disarms the confirmation

  function disarm() {
    clearTimeout(armed);
    armed = null;
    remove.textContent = "Delete model";
  }
  remove.addEventListener("click", async () => {
    if (!armed) {
      remove.textContent = "Confirm delete";
      armed = setTimeout(disarm, CONFIRM_MS);
      return;
    }
    disarm();
    const id = model;
    remove.disabled = true;
    try {
      await deleteModel(id);
      toast(`Model ${id} deleted`, "ok");
      onDeleted(id);
    } catch (e) {
      if (e.status === 404) onDeleted(id);
      else if (e.name !== "AbortError") toast(`Could not delete the model: ${e.message}`, "error");
    } finally {
      remove.disabled = false;
    }
  });

  return {
    node,
    /** The model Delete model offers (null: none, or it is deleted). */
    setModel(id) {
      model = id || null;
      remove.hidden = !model;
      if (!model) disarm();
    },
    destroy() { clearTimeout(armed); },
  };
}
