// The "Generate text" card: prompt and sampling options, POST /v1/models/{id}/generate.

import { el } from "../../util.js";
import { tryItLink } from "../playground/models.js";
import { fillModelSelect, modelSelect } from "./models.js";

const field = (id, label, control) => el("div", { class: "field" }, el("label", { for: id }, label), control);
const numberOrUndefined = (input) => (input.value.trim() === "" ? undefined : Number(input.value));

/** endpoints: jobEndpoints(); setModels(models) refills the picker. */
export function generateCard({ endpoints }) {
  const model = modelSelect("gen-model");
  const prompt = el("textarea", { id: "gen-prompt", rows: 3, placeholder: "ROMEO:" }, "");
  const maxTokens = el("input", { id: "gen-max-tokens", type: "number", min: 1, max: 2048, value: 200 });
  const temperature = el("input", { id: "gen-temperature", type: "number", min: 0, max: 5, step: 0.1, value: 0.8 });
  const topK = el("input", { id: "gen-top-k", type: "number", min: 1, placeholder: "off" });
  const seed = el("input", { id: "gen-seed", type: "number", placeholder: "random" });
  const button = el("button", { type: "submit", class: "primary", disabled: true }, "Generate");
  const output = el("pre", { class: "gen-output", id: "gen-output", "aria-live": "polite" });
  const tryIt = tryItLink(model); // the playground with the chosen model (streamed chat, completions)
  const node = el("form", { class: "card", "aria-labelledby": "gen-h" },
    el("h2", { id: "gen-h" }, "Generate text"),
    field("gen-model", "Model or checkpoint", model),
    field("gen-prompt", "Prompt", prompt),
    el("div", { class: "grid grid-4" },
      field("gen-max-tokens", "Max tokens", maxTokens),
      field("gen-temperature", "Temperature", temperature),
      field("gen-top-k", "Top-k", topK),
      field("gen-seed", "Seed", seed)),
    el("div", { class: "actions" }, button, tryIt.node), output);

  let available = 0; // how many models the picker offers

  node.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (!model.value) return;
    button.disabled = true;
    button.textContent = "Generating…";
    output.textContent = "";
    output.classList.remove("error-text");
    try {
      const body = {
        prompt: prompt.value, max_tokens: numberOrUndefined(maxTokens), temperature: numberOrUndefined(temperature),
        top_k: numberOrUndefined(topK), seed: numberOrUndefined(seed),
      };
      const res = await endpoints.generate(model.value, body);
      output.textContent = "";
      output.append(el("span", { class: "prompt-echo" }, prompt.value), res.text ?? "");
    } catch (e) {
      if (e.name === "AbortError") return;
      output.textContent = e.message;
      output.classList.add("error-text");
    } finally {
      button.disabled = !available;
      button.textContent = "Generate";
    }
  });

  return {
    node,
    setModels(models) {
      available = models.length;
      fillModelSelect(model, models);
      tryIt.update();
      button.disabled = !available;
    },
  };
}
