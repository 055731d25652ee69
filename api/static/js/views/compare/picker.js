// Choosing the runs to compare: the newest jobs (one page of them) with a checkbox each, at most
// MAX_RUNS ticked; "Compare" opens #/compare?jobs=... with the ticked ones.

import { api, query } from "../../api.js";
import { badge, clear, el, fmtTime } from "../../util.js";
import { MAX_RUNS, compareHash } from "./runs.js";

const PAGE = 50;

/** chosen: the ids ticked at first; signal: the page's. load() lists the jobs (once). */
export function runPicker({ chosen, signal }) {
  const picked = new Set(chosen);
  const list = el("ul", { class: "cmp-pick-list", id: "cmp-pick-list", "aria-busy": "true" });
  const status = el("p", { class: "muted small", role: "status" }, "Loading jobs…");
  const go = el("button", { type: "button", class: "primary", id: "cmp-pick-go" }, "Compare");
  const node = el("section", { class: "card cmp-picker", "aria-labelledby": "cmp-pick-h" },
    el("h2", { id: "cmp-pick-h" }, "Choose runs"),
    el("p", { class: "help" }, `Tick up to ${MAX_RUNS} jobs.`),
    status, list, el("div", { class: "actions" }, go));

  function sync() {
    for (const box of list.querySelectorAll("input[type=checkbox]")) box.disabled = !box.checked && picked.size >= MAX_RUNS;
    go.disabled = picked.size === 0;
    go.textContent = picked.size ? `Compare ${picked.size}` : "Compare";
  }

  go.addEventListener("click", () => { location.hash = compareHash([...picked]); });

  let loading = null;
  const load = () => (loading ??= (async () => {
    try {
      const page = await api(`/fine_tuning/jobs${query({ limit: PAGE })}`, { signal });
      const jobs = page.data || [];
      status.textContent = jobs.length ? "" : "No jobs yet.";
      clear(list, jobs.map((job) => {
        const box = el("input", { type: "checkbox", id: `cmp-pick-${job.id}`, value: job.id, checked: picked.has(job.id) });
        box.addEventListener("change", () => { if (box.checked) picked.add(job.id); else picked.delete(job.id); sync(); });
        return el("li", { dataset: { jobId: job.id } },
          el("label", { for: box.id, class: "cmp-pick" }, box,
            el("span", { class: "mono" }, job.id), badge(job.status),
            el("span", { class: "muted small" }, [job.suffix, job.model, fmtTime(job.created_at)].filter(Boolean).join(" · "))));
      }));
    } catch (e) {
      if (e.name === "AbortError") return;
      status.className = "error-banner";
      status.textContent = `Could not list jobs: ${e.message}`;
    } finally {
      list.setAttribute("aria-busy", "false");
      sync();
    }
  })());
  sync();
  return { node, load };
}
