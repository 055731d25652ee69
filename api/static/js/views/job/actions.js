// Pause, resume and cancel (cancel asks for a second click within 4 s). Which buttons are enabled
// follows the job's status; the server decides what is allowed and says why when it refuses.

import { el, toast } from "../../util.js";

const CONFIRM_MS = 4000;

/**
 * statuses: the served status sets. request(action): POSTs the action and applies the job it
 * answers. rerender(): shows the job as it was (after a refused action).
 */
export function jobActions({ statuses, request, rerender }) {
  const cancel = el("button", { type: "button", class: "danger", id: "btn-cancel", disabled: true }, "Cancel");
  const pause = el("button", { type: "button", class: "secondary", id: "btn-pause", disabled: true }, "Pause");
  const resume = el("button", { type: "button", class: "secondary", id: "btn-resume", disabled: true }, "Resume");
  const node = el("div", { class: "controls", role: "group", "aria-label": "Job controls" }, pause, resume, cancel);

  let armed = null; // the timer that disarms the cancel confirmation
  function disarm() {
    clearTimeout(armed);
    armed = null;
    cancel.textContent = "Cancel";
  }
  cancel.addEventListener("click", () => {
    if (!armed) {
      cancel.textContent = "Confirm cancel";
      armed = setTimeout(disarm, CONFIRM_MS);
      return;
    }
    disarm();
    act("cancel");
  });
  pause.addEventListener("click", () => act("pause"));
  resume.addEventListener("click", () => act("resume"));

  async function act(action) {
    for (const b of [cancel, pause, resume]) b.disabled = true;
    try {
      await request(action);
      toast(`${action} requested`);
    } catch (e) {
      if (e.name !== "AbortError") toast(`Could not ${action}: ${e.message}`, "error");
      rerender();
    }
  }

  return {
    node,
    render(job) {
      const { status } = job;
      const ended = statuses.terminal.has(status);
      const pausing = Boolean(job.pause_requested); // asked: it pauses at its next step's end
      cancel.disabled = ended;
      // "paused" is in none of the served sets: a job there can only be resumed (or cancelled)
      pause.disabled = ended || status === "paused" || pausing;
      pause.textContent = pausing ? "Pausing…" : "Pause";
      resume.disabled = status !== "paused";
    },
    destroy() { clearTimeout(armed); },
  };
}
