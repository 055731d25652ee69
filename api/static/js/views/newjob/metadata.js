// The job's metadata: key/value rows (OpenAI's `metadata`, up to 16 pairs of strings), added and
// removed by the user; rows with an empty key are left out. The server checks the limits and its
// error lands on the section (param `metadata`).

import { el } from "../../util.js";

const MAX_PAIRS = 16;
const MAX_KEY = 64;
const MAX_VALUE = 512;

/** errors: FieldErrors. body(): {key: value} of the filled rows, or undefined when none. */
export function metadataSection({ errors }) {
  const rows = el("div", { class: "kv-rows", id: "metadata-rows" });
  const add = el("button", { type: "button", class: "secondary", id: "metadata-add" }, "Add metadata");
  const slotAnchor = el("span", { id: "metadata", tabindex: -1 });
  let n = 0;

  function addRow(key = "", value = "") {
    const i = n++;
    const k = el("input", { type: "text", id: `metadata-key-${i}`, class: "md-key", maxlength: MAX_KEY, value: key,
      placeholder: "key", autocomplete: "off", "aria-label": `Metadata key ${i + 1}` });
    const v = el("input", { type: "text", id: `metadata-value-${i}`, class: "md-value", maxlength: MAX_VALUE, value,
      placeholder: "value", autocomplete: "off", "aria-label": `Metadata value ${i + 1}` });
    const remove = el("button", { type: "button", class: "link md-remove", "aria-label": `Remove metadata ${i + 1}` }, "✕");
    const row = el("div", { class: "kv-row" }, k, v, remove);
    remove.addEventListener("click", () => { row.remove(); rows.dispatchEvent(new Event("input", { bubbles: true })); sync(); });
    rows.append(row);
    sync();
    return k;
  }
  function sync() { add.disabled = rows.childElementCount >= MAX_PAIRS; }
  add.addEventListener("click", () => addRow().focus());

  const node = el("fieldset", { class: "metadata" },
    el("legend", {}, "Metadata"),
    el("p", { class: "help", id: "metadata-help" },
      `Your own key/value labels for the job (up to ${MAX_PAIRS}); list jobs by them with metadata[key]=value.`),
    slotAnchor, rows, el("div", { class: "actions" }, add), errors.slot("metadata", slotAnchor));
  return {
    node,
    addRow,
    body() {
      const out = {};
      for (const row of rows.children) {
        const key = row.querySelector(".md-key").value.trim();
        if (key) out[key] = row.querySelector(".md-value").value;
      }
      return Object.keys(out).length ? out : undefined;
    },
  };
}
