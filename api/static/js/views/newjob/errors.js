// Errors shown where they belong: next to the field an API error's `param` names, with the field
// marked aria-invalid and focused, or in a banner at the top of the form when no field matches.
// One API answer may list several fields' problems in its message ("seed: ...; suffix: ..." for a
// request that fails its types, "Invalid hyperparameters: n_embd: ...; n_head: ..." for a config):
// each problem goes under its own field, not all of them under the first one (`param`).

import { el } from "../../util.js";

const NAMED = /^([A-Za-z_][\w.[\]]*): /; // "name: " (a field, a dotted path, integrations[0].x)

/** [[name, "name: problem"], ...] of a message listing problems as "name: problem; name: problem"
 *  (after an optional heading such as "Invalid hyperparameters: "); null when it is not such a
 *  list. A "; " splits only before another "name: ", so "must be one of a, b; got 'c'" stays whole. */
export function splitProblems(message) {
  const pieces = String(message || "").split(/; (?=[A-Za-z_][\w.[\]]*: )/);
  pieces[0] = pieces[0].replace(/^[A-Z][^:;]*: (?=[A-Za-z_][\w.[\]]*: )/, "");
  const problems = pieces.map((piece) => {
    const named = NAMED.exec(piece);
    return named && [named[1], piece];
  });
  return problems.every(Boolean) ? problems : null;
}

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

  /** The field `param` names: "hyperparameters.n_embd", "method.supervised.hyperparameters.n_embd",
   *  "training_file", ... (itself, its last part, its first part); null when none. */
  #fieldOf(param) {
    const parts = String(param || "").split(".");
    return [param, parts[parts.length - 1], parts[0]].find((name) => name && this.#slots.has(name)) ?? null;
  }

  /** Mark field `name` with `message`, unfold the section it is in; returns its control. */
  #mark(name, message) {
    const input = this.set(name, message);
    const details = input && input.closest("details");
    if (details) details.open = true;
    return input;
  }

  #showBanner(text) {
    this.banner.hidden = false;
    this.banner.textContent = text;
    this.banner.focus();
  }

  /** Show `message` next to the field `param` names. Falls back to the banner. */
  show(param, message) {
    const name = this.#fieldOf(param);
    if (!name) {
      this.#showBanner(param ? `${param}: ${message}` : message);
      return;
    }
    const input = this.#mark(name, message);
    if (input) input.focus();
  }

  /** An API error: each problem its message lists goes under its own field (several problems of
   *  one field under that field), those of no field to the banner; a message that lists none goes
   *  next to `param`'s field. slotOf(param) maps an API param to a slot name (integrations'). */
  showApi(param, message, slotOf = (p) => p) {
    const problems = splitProblems(message);
    const byField = new Map(); // field -> its problems, in the message's order
    const loose = [];
    for (const [name, problem] of problems || []) {
      const field = this.#fieldOf(slotOf(name));
      if (field) byField.set(field, [...(byField.get(field) || []), problem]);
      else loose.push(problem);
    }
    if (!byField.size) {
      this.show(slotOf(param), message);
      return;
    }
    const inputs = [...byField].map(([field, texts]) => this.#mark(field, texts.join("; ")));
    if (loose.length) this.#showBanner(loose.join("; "));
    else inputs.find(Boolean)?.focus();
  }
}
