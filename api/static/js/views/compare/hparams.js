// The runs' settings side by side: the request's model, seed and files, then the resolved model and
// training configs (job.config, every value the trainer used, defaults included; a setting left auto
// shows what the worker decided, "auto → bfloat16", once the run started). Rows whose values differ
// between the runs are highlighted; "Only differences" hides the rest.

import { clear, el } from "../../util.js";

const TOP = [["model", (r) => r.job.model], ["seed", (r) => r.job.seed], ["training_file", (r) => r.job.training_file],
  ["validation_file", (r) => r.job.validation_file], ["suffix", (r) => r.job.suffix]];

/** A config value, or for one left auto (null, "auto") what the run's worker decided, when it did. */
function configValue(run, part, name) {
  const config = run.job.config && run.job.config[part];
  const value = config ? config[name] : undefined;
  const decided = run.decided ? run.decided[name] : undefined;
  return (value === null || value === "auto") && decided !== undefined ? `auto → ${decided}` : value;
}

/** [[name, (run) => value]] for every setting any of the runs' jobs has, in a stable order. */
function rows(runs) {
  const out = [...TOP];
  for (const part of ["model", "train"]) {
    const names = [];
    for (const { job } of runs) {
      for (const name of Object.keys((job.config && job.config[part]) || {})) if (!names.includes(name)) names.push(name);
    }
    for (const name of names) out.push([`${part}.${name}`, (r) => configValue(r, part, name)]);
  }
  return out;
}

const shown = (v) => (v === undefined ? "—" : v === null ? "null" : Array.isArray(v) ? v.join(", ") || "[]" : String(v));

export function hyperparameterTable() {
  const onlyDiff = el("input", { type: "checkbox", id: "cmp-only-diff" });
  const count = el("span", { class: "muted small", id: "cmp-diff-count" });
  const table = el("table", { class: "table cmp-hparams", id: "cmp-hparams" });
  const node = el("section", { class: "card", "aria-labelledby": "cmp-hp-h" },
    el("div", { class: "card-head" }, el("h2", { id: "cmp-hp-h" }, "Hyperparameters"), count,
      el("label", { class: "toggle", for: "cmp-only-diff" }, onlyDiff, " Only differences")),
    el("div", { class: "table-wrap" }, table));
  onlyDiff.addEventListener("change", () => table.classList.toggle("only-diff", onlyDiff.checked));
  let shownIds = "";

  return {
    node,
    /** runs with a job; the table is rebuilt only when the set of runs changes, or what a run's
     *  worker decided arrives (the settings themselves do not change). */
    render(runs) {
      const ready = runs.filter((r) => r.job);
      const ids = ready.map((r) => `${r.id}:${Object.keys(r.decided || {}).length}`).join(",");
      if (ids === shownIds) return;
      shownIds = ids;
      let differing = 0;
      const all = rows(ready);
      const body = all.map(([name, get]) => {
        const values = ready.map((r) => shown(get(r)));
        const differs = new Set(values).size > 1;
        if (differs) differing += 1;
        return el("tr", { class: differs ? "differs" : null, dataset: { param: name, differs: differs ? "true" : "false" } },
          el("th", { scope: "row", class: "mono" }, name),
          values.map((v) => el("td", { class: "mono" }, v)));
      });
      clear(table,
        el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "setting"), ready.map((r) => el("th", { scope: "col" },
          el("span", { class: "swatch", style: `background:${r.cssColor}` }), " ", r.label)))),
        el("tbody", {}, body));
      count.textContent = ready.length > 1 ? `${differing} of ${all.length} differ` : "";
    },
  };
}
