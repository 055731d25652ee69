// Completion mode: a prompt, and its continuation (POST /v1/completions) appended after it as it
// streams in. "Continue from here" makes prompt + continuation the next prompt. The job page's
// generate card is this pane too (idPrefix "gen").

import { el } from "../../util.js";

export function completionPane({ idPrefix = "pg", rows = 5 } = {}) {
  const prompt = el("textarea", { id: `${idPrefix}-prompt`, name: "prompt", rows, placeholder: "ROMEO:" });
  const echo = el("span", { class: "prompt-echo" });
  const generated = el("span", { class: "generated" });
  const output = el("pre", { class: "gen-output pg-output", id: `${idPrefix}-output`, role: "region", "aria-label": "Output",
    "aria-live": "polite" });
  const keep = el("button", { type: "button", class: "secondary", hidden: true }, "Continue from here");
  keep.addEventListener("click", () => {
    prompt.value = echo.textContent + generated.textContent;
    output.replaceChildren();
    keep.hidden = true;
    prompt.focus();
  });
  const node = el("div", { class: "pg-pane", dataset: { mode: "completion" } },
    el("div", { class: "field" }, el("label", { for: prompt.id }, "Prompt"), prompt),
    output,
    el("div", { class: "actions" }, keep));

  return {
    node,
    path: "/completions",
    submitLabel: "Generate",
    request() {
      if (!prompt.value) { prompt.focus(); return null; }
      return { prompt: prompt.value };
    },
    begin() {
      echo.textContent = prompt.value;
      generated.replaceChildren();
      output.replaceChildren(echo, generated);
      output.classList.add("streaming");
      output.setAttribute("aria-busy", "true"); // screen readers read the text once, when it is complete
      keep.hidden = true;
      return {
        append(piece) { generated.append(piece); output.scrollTop = output.scrollHeight; },
        end(outcome) {
          output.classList.remove("streaming");
          output.removeAttribute("aria-busy");
          generated.normalize();
          output.dataset.outcome = outcome;
          keep.hidden = !generated.textContent;
        },
      };
    },
    clear() {
      output.replaceChildren();
      keep.hidden = true;
    },
    focus() { prompt.focus(); },
  };
}
