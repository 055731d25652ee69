// The job's configuration: every hyperparameter it runs with (the resolved trainer configs the job
// carries, job.config), in the order of the served schema, with the ones that differ from what the
// job would get by default marked. Defaults are the server's (served.js), never a copy here.

import { clear, el } from "../../util.js";
import { defaultValue, schemaFields } from "../newjob/schema.js";

/** A value as the table shows it (and compares it): numbers as numbers, lists joined. */
function shown(v) {
  if (v === null || v === undefined) return "—";
  if (Array.isArray(v)) return v.join(", ") || "—";
  return String(v);
}

const same = (a, b) => (typeof a === "number" && typeof b === "number" ? a === b : shown(a) === shown(b));

/** [{name, value, def, changed}] for every field the job has: the schema's first, then the rest. */
export function configRows(job, schema) {
  const cfg = job.config || {};
  const model = cfg.model || {}, train = cfg.train || {};
  const presets = schema["x-presets"] || {};
  const preset = job.model in presets ? job.model : null; // a continued model's architecture is its parent's
  const hp = job.hyperparameters || {};
  const rows = [];
  const seen = new Set();
  for (const f of schemaFields(schema)) {
    const source = f.architecture ? model : f.name in train ? train : hp;
    if (!(f.name in source)) continue;
    seen.add(f.name);
    const value = source[f.name];
    const known = !f.architecture || preset !== null;
    const def = known ? defaultValue(schema, f, preset) : undefined;
    rows.push({ name: f.name, label: f.label, value, def, changed: known && !same(value, def) });
  }
  for (const [name, value] of [...Object.entries(model), ...Object.entries(train)]) {
    if (!seen.has(name)) rows.push({ name, label: name, value, def: undefined, changed: false });
    seen.add(name);
  }
  return rows;
}

export function configCard() {
  const body = el("tbody");
  const count = el("span", { class: "small muted", id: "config-changed" });
  const node = el("section", { class: "card", "aria-labelledby": "cfg-h" },
    el("div", { class: "card-head" }, el("h2", { id: "cfg-h" }, "Configuration"), count),
    el("div", { class: "table-wrap config-wrap" }, el("table", { class: "table config", id: "config" },
      el("thead", {}, el("tr", {}, ["Hyperparameter", "Value", "Default"].map((h) => el("th", { scope: "col" }, h)))),
      body)));
  return {
    node,
    render(job, schema) {
      const rows = configRows(job, schema);
      const changed = rows.filter((r) => r.changed).length;
      count.textContent = `${rows.length} settings, ${changed} changed from the defaults (marked ●)`;
      clear(body, rows.map((r) => el("tr", { class: r.changed ? "changed" : "", dataset: { field: r.name } },
        el("th", { scope: "row", class: "mono" }, r.changed ? el("span", { class: "changed-mark", title: "differs from the default" }, "● ") : null, r.name),
        el("td", { class: "mono value" }, shown(r.value)),
        el("td", { class: "mono muted" }, r.def === undefined ? "" : shown(r.def)))));
    },
  };
}
