// The runs' settings side by side: the request's model, seed and files, then the resolved model and
// training configs (job.config, every value the trainer used, defaults included). Rows whose values
// differ between the runs are highlighted; "Only differences" hides the rest.

import { clear, el } from "../../util.js";

const TOP = [["model", (j) => j.model], ["seed", (j) => j.seed], ["training_file", (j) => j.training_file],
  ["validation_file", (j) => j.validation_file], ["suffix", (j) => j.suffix]];

/** [[name, (job) => value]] for every setting any of the jobs has, in a stable order. */
function rows(jobs) {
  const out = [...TOP];
  for (const part of ["model", "train"]) {
    const names = [];
    for (const job of jobs) {
      for (const name of Object.keys((job.config && job.config[part]) || {})) if (!names.includes(name)) names.push(name);
    }
    for (const name of names) out.push([`${part}.${name}`, (j) => (j.config && j.config[part] ? j.config[part][name] : undefined)]);
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
    /** runs with a job; the table is rebuilt only when the set of runs changes (settings do not). */
    render(runs) {
      const ready = runs.filter((r) => r.job);
      const ids = ready.map((r) => r.id).join(",");
      if (ids === shownIds) return;
      shownIds = ids;
      const jobs = ready.map((r) => r.job);
      let differing = 0;
      const all = rows(jobs);
      const body = all.map(([name, get]) => {
        const values = jobs.map((j) => shown(get(j)));
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
      count.textContent = jobs.length > 1 ? `${differing} of ${all.length} differ` : "";
    },
  };
}
