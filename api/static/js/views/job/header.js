// The job page's head: id, status badge, live/polling indicator, model line, and the error banner
// (the job's own error, or why the page could not load it).

import { badge, clear, el, fmtTime } from "../../util.js";

const MODE_TEXT = { stream: "● live", polling: "● polling", done: "", loading: "loading…" };

export function jobHeader(id, controls) {
  const statusSlot = el("span", { class: "status-slot" });
  const liveMode = el("span", { class: "live-mode small muted", id: "live-mode", dataset: { mode: "loading" } }, "");
  const modelLine = el("p", { class: "muted model-line" });
  // why a queued job cannot start (no worker for its queue, the key's running-job limit)
  const waitingLine = el("p", { class: "small waiting-for", id: "waiting-for", hidden: true });
  const errorBox = el("div", { class: "error-banner", role: "alert", hidden: true });
  const node = el("div", { class: "page-head job-head" },
    el("div", {}, el("a", { href: "#/jobs", class: "back small" }, "← All jobs"),
      el("div", { class: "title-row" }, el("h1", { class: "mono job-title" }, id), statusSlot, liveMode), modelLine,
      waitingLine),
    controls);

  return {
    node,
    errorBox,
    /** deleted: the models known to be deleted (the job's own is then marked so). */
    showJob(job, deleted = new Set()) {
      // a pause waits for the step in progress (a compile, an evaluation) and a checkpoint
      clear(statusSlot, badge(job.status),
        job.pause_requested ? el("span", { class: "small muted", id: "pausing" }, " pausing…") : null);
      clear(modelLine, `${job.model || ""}`,
        job.fine_tuned_model ? el("span", {}, " → ", el("code", { id: "fine-tuned-model" }, job.fine_tuned_model),
          deleted.has(job.fine_tuned_model) ? el("span", { class: "muted", id: "model-deleted" }, " (deleted)") : null) : null,
        ` · created ${fmtTime(job.created_at)}`, job.finished_at ? ` · finished ${fmtTime(job.finished_at)}` : "");
      waitingLine.hidden = !job.waiting_for;
      waitingLine.textContent = job.waiting_for ? `Waiting: ${job.waiting_for}` : "";
      if (job.error && job.error.message) {
        errorBox.hidden = false;
        clear(errorBox, el("strong", {}, "Failed: "), job.error.message, job.error.code ? ` (${job.error.code})` : "");
      } else errorBox.hidden = true;
    },
    setMode(mode) {
      liveMode.dataset.mode = mode;
      liveMode.textContent = MODE_TEXT[mode] ?? mode;
    },
    showLoadError(message) {
      errorBox.hidden = false;
      errorBox.textContent = message;
    },
  };
}
