// Errors shown where they belong: next to the field an API error's `param` names, with the field
// marked aria-invalid and focused, or in a banner at the top of the form when no field matches.

import { el } from "../../util.js";

export class FieldErrors {
  #slots = new Map(); // field name -> its error <p>
  #inputs = new Map(); // field name -> its control
  banner = el("div", { class: "error-banner", role: "alert", hidden: true, tabindex: -1 });

  /** The error slot of field `name` (id err-<name>, which its control's aria-describedby names). */
  slot(name, input) {
    const p = el("p", { id: `err-${name}`, class: "field-error", role: "alert", dataset: { param: name } });
    this.#slots.set(name, p);
    this.#inputs.set(name, input);
    return p;
  }

  set(name, message) {
    const slot = this.#slots.get(name);
    if (slot) slot.textContent = message;
    const input = this.#inputs.get(name);
    if (input) {
      if (message) input.setAttribute("aria-invalid", "true"); else input.removeAttribute("aria-invalid");
    }
    return input;
  }

  clear() {
    for (const name of this.#slots.keys()) this.set(name, "");
    this.banner.hidden = true;
    this.banner.textContent = "";
  }

  /** Show `message` next to the field `param` names: "hyperparameters.n_embd",
   *  "method.supervised.hyperparameters.n_embd", "training_file", ... Falls back to the banner. */
  show(param, message) {
    const parts = String(param || "").split(".");
    for (const name of [param, parts[parts.length - 1], parts[0]]) {
      if (name && this.#slots.has(name)) {
        const input = this.set(name, message);
        const details = input && input.closest("details");
        if (details) details.open = true;
        if (input) input.focus();
        return;
      }
    }
    this.banner.hidden = false;
    this.banner.textContent = param ? `${param}: ${message}` : message;
    this.banner.focus();
  }
}
