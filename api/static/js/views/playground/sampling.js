// The sampling controls: max_tokens, temperature, top_p, seed, the frequency and presence penalties
// and stop sequences, as the request
// fields OpenAI's completions take. An empty box is left out (the server's default applies); a
// field the API names in an error is marked and focused. The job page's generate card uses them too
// (idPrefix "gen", inside its own form: no card of their own).

import { el } from "../../util.js";

// the request field's name as the tooltip: these are the API's own parameters
const field = (id, label, control, help) => el("div", { class: "field", title: control.name },
  el("label", { for: id }, label), control, help ? el("p", { class: "help", id: `${id}-help` }, help) : null);

// OpenAI's bounds; empty (the placeholder's 0) leaves the field out
const PENALTY = { min: -2, max: 2, placeholder: "0" };

const number = (id, name, attrs) => el("input", { id, name, type: "number", step: "any", ...attrs });

/** "\n" and "\t" typed as two characters mean a newline and a tab (a stop sequence is often "\n"). */
export function parseStops(text) {
  return text.split("\n").filter((line) => line !== "")
    .map((line) => line.replace(/\\(n|t|\\)/g, (_, c) => (c === "n" ? "\n" : c === "t" ? "\t" : "\\")));
}

/** idPrefix: the controls' ids (<prefix>-max-tokens, ...); card: a card of its own with a heading. */
export function samplingFields({ idPrefix = "pg", card = true } = {}) {
  const id = (name) => `${idPrefix}-${name}`;
  const inputs = {
    max_tokens: number(id("max-tokens"), "max_tokens", { min: 1, step: 1, value: 128 }),
    temperature: number(id("temperature"), "temperature", { min: 0, max: 2, value: 0.8 }),
    top_p: number(id("top-p"), "top_p", { min: 0, max: 1, value: 1 }),
    seed: number(id("seed"), "seed", { step: 1, placeholder: "random" }),
    frequency_penalty: number(id("frequency-penalty"), "frequency_penalty", PENALTY),
    presence_penalty: number(id("presence-penalty"), "presence_penalty", PENALTY),
    stop: el("textarea", { id: id("stop"), name: "stop", rows: 2, placeholder: "none",
      "aria-describedby": `${id("stop")}-help` }),
  };
  const fields = [
    el("div", { class: "grid grid-4" },
      field(id("max-tokens"), "Max tokens", inputs.max_tokens),
      field(id("temperature"), "Temperature", inputs.temperature),
      field(id("top-p"), "Top-p", inputs.top_p),
      field(id("seed"), "Seed", inputs.seed)),
    el("div", { class: "grid grid-4" },
      field(id("frequency-penalty"), "Frequency penalty", inputs.frequency_penalty),
      field(id("presence-penalty"), "Presence penalty", inputs.presence_penalty)),
    field(id("stop"), "Stop sequences", inputs.stop, "One per line, up to 4; \\n is a newline.")];
  const node = card
    ? el("section", { class: "card pg-sampling", "aria-labelledby": id("sampling-h") },
      el("h2", { id: id("sampling-h") }, "Sampling"), fields)
    : el("div", { class: "sampling" }, fields);

  return {
    node,
    /** The request fields: numbers as typed, stop as a list; empty boxes are left out. */
    values() {
      const out = {};
      for (const name of Object.keys(inputs)) {
        if (name === "stop") continue;
        const text = inputs[name].value.trim();
        if (text !== "") out[name] = Number(text);
      }
      const stops = parseStops(inputs.stop.value);
      if (stops.length) out.stop = stops;
      return out;
    },
    /** Mark the control the API named in an error (`param`); false when none of these is it. */
    markInvalid(param) {
      for (const input of Object.values(inputs)) input.removeAttribute("aria-invalid");
      const input = inputs[String(param || "").split(/[.[]/)[0]];
      if (!input) return false;
      input.setAttribute("aria-invalid", "true");
      input.focus();
      return true;
    },
  };
}
