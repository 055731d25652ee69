// The "Generate text" card: a prompt continued by one of the job's models (its final model or a
// checkpoint), streamed in as the playground streams it (POST /v1/completions, stream: true), with
// the playground's own pieces: its completion pane, its sampling controls (max tokens, temperature,
// top-p, seed, stop) and its run line (usage, tokens/s). Stop hangs up.

import { el } from "../../util.js";
import { completionPane } from "../playground/completion.js";
import { tryItLink } from "../playground/models.js";
import { samplingFields } from "../playground/sampling.js";
import { runStats } from "../playground/stats.js";
import { streamRun } from "../playground/stream.js";
import { fillModelSelect, modelSelect } from "./models.js";

/** signal: the page's (leaving it stops a run); setModels(models) refills the picker. */
export function generateCard({ signal }) {
  const model = modelSelect("gen-model");
  const pane = completionPane({ idPrefix: "gen", rows: 3 });
  const sampling = samplingFields({ idPrefix: "gen", card: false });
  const stats = runStats({ id: "gen-stats" });
  const button = el("button", { type: "submit", class: "primary", disabled: true }, "Generate");
  const stop = el("button", { type: "button", class: "secondary", id: "gen-stop-button", disabled: true }, "Stop");
  const errorBox = el("div", { class: "error-banner", role: "alert", id: "gen-error", hidden: true });
  const tryIt = tryItLink(model); // the playground with the chosen model (chat too)
  const node = el("form", { class: "card", "aria-labelledby": "gen-h" },
    el("h2", { id: "gen-h" }, "Generate text"),
    el("div", { class: "field" }, el("label", { for: "gen-model" }, "Model or checkpoint"), model),
    pane.node, sampling.node, errorBox,
    el("div", { class: "actions" }, button, stop, tryIt.node), stats.node);

  let available = 0; // how many models the picker offers
  let run = null; // the AbortController of the run in flight
  signal.addEventListener("abort", () => run?.abort(), { once: true });
  stop.addEventListener("click", () => run?.abort());

  node.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const part = pane.request();
    if (run || !model.value || !part) return;
    errorBox.hidden = true;
    sampling.markInvalid(null);
    run = new AbortController();
    button.disabled = true;
    stop.disabled = false;
    const body = { model: model.value, ...part, ...sampling.values() };
    const { error } = await streamRun("/completions", body, { signal: run.signal, sink: pane.begin(), stats });
    if (error) {
      errorBox.textContent = error.code ? `${error.message} (${error.code})` : error.message;
      errorBox.hidden = false;
      sampling.markInvalid(error.param);
    }
    run = null;
    button.disabled = !available;
    stop.disabled = true;
  });

  return {
    node,
    setModels(models) {
      available = models.length;
      fillModelSelect(model, models);
      tryIt.update();
      if (!run) button.disabled = !available;
    },
  };
}
