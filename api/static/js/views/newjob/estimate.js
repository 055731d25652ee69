// The live estimate beside the form: what the job would be (parameters, memory against the worker's,
// steps, tokens, time on its worker class), from the server's own admission arithmetic (POST
// /v1/fine_tuning/jobs/estimate), asked again as the user types (debounced; a newer question
// cancels the one in flight). A job the service would refuse says why, with the numbers.

import { api } from "../../api.js";
import { clear, el, fmtBytes, fmtDuration, fmtInt } from "../../util.js";

const DEBOUNCE_MS = 350;

const item = (key, label, value) => [el("dt", {}, label), el("dd", { id: `est-${key}` }, value)];

function render(list, note, e) {
  const time = e.seconds === null ? `unknown on ${e.queue} (no job of that worker class has finished yet)`
    : `about ${fmtDuration(e.seconds)} on ${e.queue}`;
  clear(list, [
    item("parameters", "Parameters", fmtInt(e.parameters)),
    item("memory", "Memory", `${fmtBytes(e.memory_bytes)} of ${fmtBytes(e.memory_limit_bytes)} (${e.device} worker)`),
    item("steps", "Steps", `up to ${fmtInt(e.steps)}`),
    item("tokens", "Tokens", `up to ${fmtInt(e.tokens)} (${fmtInt(e.tokens_per_step)} per step)`
      + (e.eval_tokens ? `, and ${fmtInt(e.eval_tokens)} read by evaluations` : "")),
    item("time", "Time", time),
  ].flat());
  note.hidden = !e.problem;
  note.textContent = e.problem ? `Would be refused: ${e.problem.message}` : "";
  note.className = "est-note warn-text";
}

/** body(): the create request as the form would send it now, or null when it cannot be (no file). */
export function estimatePanel({ body, signal }) {
  const list = el("dl", { class: "run-summary", id: "estimate" });
  const note = el("p", { class: "est-note", id: "estimate-note", role: "status", hidden: true });
  const hint = el("p", { class: "help", id: "estimate-hint" }, "Choose a training file to see the job's size and time.");
  const node = el("section", { class: "estimate", "aria-labelledby": "est-h", "aria-live": "polite" },
    el("h2", { id: "est-h" }, "Estimate"), hint, list, note);
  let timer = null, inFlight = null, asked = 0;

  async function ask() {
    const request = body();
    if (!request) return;
    inFlight?.abort();
    const mine = ++asked;
    inFlight = new AbortController();
    signal.addEventListener("abort", () => inFlight?.abort(), { once: true });
    node.dataset.state = "asking";
    try {
      const e = await api("/fine_tuning/jobs/estimate", { method: "POST", body: request, signal: inFlight.signal });
      if (mine !== asked) return;
      hint.hidden = true;
      render(list, note, e);
      node.dataset.state = e.problem ? "refused" : "ok";
    } catch (err) {
      if (err.name === "AbortError" || mine !== asked) return;
      note.hidden = false;
      note.className = "est-note error-text";
      note.textContent = `No estimate: ${err.message}`;
      node.dataset.state = "error";
    }
  }
  return {
    node,
    /** Ask again soon (the user is typing). */
    update() { clearTimeout(timer); timer = setTimeout(ask, DEBOUNCE_MS); },
  };
}
