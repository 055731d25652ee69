// Jobs list: newest first, cursor-paginated with `after`, refreshed every few seconds while any job
// on the page is still live (not in the API's terminal set). Jobs ticked for comparison (kept for
// the session, across pages) open together in #/compare.

import { api, query } from "../api.js";
import { badge, clear, el, fmtDuration, fmtInt, fmtLoss, fmtTime, progressBar } from "../util.js";
import { MAX_RUNS, compareHash } from "./compare/runs.js";

const PAGE_SIZE = 20;
const REFRESH_MS = 3000;

export function mountJobs(root, { after, statuses }) {
  const live = (job) => !statuses.terminal.has(job.status);
  const abort = new AbortController();
  let timer = null;
  const nodes = jobsPageNodes(after);
  root.append(nodes.header, nodes.status, nodes.list, nodes.pager);
  const picks = comparePicks(nodes.list, nodes.compare);
  let lastPage = null;
  pageButtons(after, nodes, () => lastPage);

  async function load() {
    clearTimeout(timer);
    try {
      const page = await api(`/fine_tuning/jobs${query({ limit: PAGE_SIZE, after })}`, { signal: abort.signal });
      lastPage = page;
      renderPage(page, nodes, { after, live, picks });
      if (page.data.some(live)) timer = setTimeout(load, REFRESH_MS);
    } catch (e) {
      if (e.name === "AbortError") return;
      nodes.status.textContent = `Could not load jobs: ${e.message}`;
      nodes.status.className = "error-banner";
      timer = setTimeout(load, REFRESH_MS * 3);
    }
  }

  picks.sync();
  load();
  return { destroy() { abort.abort(); clearTimeout(timer); } };
}

function jobsPageNodes(after) {
  const list = el("ul", { class: "job-list", "aria-live": "polite", "aria-busy": "true" });
  const status = el("p", { class: "muted", role: "status" }, "Loading jobs…");
  const prev = el("button", { type: "button", class: "secondary", disabled: !after }, "← Newer");
  const next = el("button", { type: "button", class: "secondary", disabled: true }, "Older →");
  const pager = el("nav", { class: "pager", "aria-label": "Job pages" }, prev, next);
  const compare = el("button", { type: "button", class: "secondary", id: "compare-selected", disabled: true,
    title: `Tick 2 to ${MAX_RUNS} jobs to compare their curves` }, "Compare");
  const header = el("div", { class: "page-head" },
    el("h1", {}, "Training jobs"),
    el("div", { class: "controls" }, compare, el("a", { class: "button primary", href: "#/new" }, "New job")));
  return { list, status, prev, next, pager, compare, header };
}

/** The jobs ticked for comparison, in the order they were ticked (kept in sessionStorage);
 *  sync() shows them on the list's boxes and the Compare button. */
function comparePicks(list, compare) {
  const readPicked = () => { try { return JSON.parse(sessionStorage.getItem("jobs.compare") || "[]"); } catch { return []; } };
  let picked = readPicked();
  function setPicked(id, on) {
    picked = on ? [...picked.filter((x) => x !== id), id] : picked.filter((x) => x !== id);
    sessionStorage.setItem("jobs.compare", JSON.stringify(picked));
    syncPicked();
  }
  function syncPicked() {
    compare.disabled = picked.length < 2;
    compare.textContent = picked.length ? `Compare ${picked.length}` : "Compare";
    for (const box of list.querySelectorAll("input.pick-box")) {
      box.checked = picked.includes(box.value);
      box.disabled = !box.checked && picked.length >= MAX_RUNS;
    }
  }
  compare.addEventListener("click", () => { location.hash = compareHash(picked); });
  list.addEventListener("change", (ev) => {
    if (ev.target.matches("input.pick-box")) setPicked(ev.target.value, ev.target.checked);
  });
  return { sync: syncPicked };
}

/** Newer and Older. The cursors of the pages we came through (a stack in sessionStorage), so
 *  Newer goes back. lastPage(): the page shown (Older continues after its last job). */
function pageButtons(after, { prev, next }, lastPage) {
  const readStack = () => { try { return JSON.parse(sessionStorage.getItem("jobs.cursors") || "[]"); } catch { return []; } };
  const writeStack = (stack) => sessionStorage.setItem("jobs.cursors", JSON.stringify(stack));
  if (!after) writeStack([]);
  prev.addEventListener("click", () => {
    const stack = readStack();
    const back = stack.pop() || "";
    writeStack(stack);
    location.hash = back ? `#/jobs?after=${encodeURIComponent(back)}` : "#/jobs";
  });
  next.addEventListener("click", () => {
    const page = lastPage();
    if (!page || !page.data.length) return;
    const stack = readStack();
    stack.push(after || "");
    writeStack(stack);
    location.hash = `#/jobs?after=${encodeURIComponent(page.data[page.data.length - 1].id)}`;
  });
}

function renderPage(page, { list, status, next }, { after, live, picks }) {
  list.setAttribute("aria-busy", "false");
  next.disabled = !page.has_more;
  if (!page.data.length) {
    status.className = "muted";
    clear(status, after ? "No more jobs." : "No jobs yet. ", after ? null : el("a", { href: "#/new" }, "Start one."));
    clear(list);
    return;
  }
  status.textContent = "";
  status.className = "muted";
  // a refresh rebuilds the cards: a ticked box that had the focus keeps it
  const focused = document.activeElement && document.activeElement.matches("input.pick-box")
    ? document.activeElement.value : null;
  clear(list, page.data.map((job) => jobCard(job, live(job))));
  picks.sync();
  if (focused) list.querySelector(`input.pick-box[value="${CSS.escape(focused)}"]`)?.focus();
}

function jobCard(job, live) {
  const p = job.progress || {};
  const step = p.step ?? 0, total = p.total_steps ?? 0;
  return el("li", { class: "job-card", dataset: { jobId: job.id, status: job.status } },
    el("div", { class: "job-card-head" },
      el("a", { class: "job-link mono", href: `#/jobs/${encodeURIComponent(job.id)}` }, job.id),
      el("span", { class: "job-card-tools" },
        el("label", { class: "job-pick", title: "Compare this job's curves with others" },
          el("input", { type: "checkbox", class: "pick-box", value: job.id, "aria-label": `Compare ${job.id}` }),
          "Compare"),
        badge(job.status))),
    el("div", { class: "job-card-model" }, job.model || "", job.fine_tuned_model
      ? el("span", { class: "muted mono small" }, ` → ${job.fine_tuned_model}`) : null),
    el("div", { class: "job-card-progress" },
      progressBar(step, total, `Progress of ${job.id}`),
      el("span", { class: "small" }, total ? `${fmtInt(step)} / ${fmtInt(total)}` : (step ? fmtInt(step) : "—"),
        live && p.eta_seconds != null ? ` · ETA ${fmtDuration(p.eta_seconds)}` : "")),
    el("dl", { class: "job-card-stats" },
      el("div", {}, el("dt", {}, "train loss"), el("dd", {}, fmtLoss(p.train_loss))),
      el("div", {}, el("dt", {}, "val loss"), el("dd", {}, fmtLoss(p.val_loss))),
      el("div", {}, el("dt", {}, "created"), el("dd", {}, fmtTime(job.created_at))),
      el("div", {}, el("dt", {}, "finished"), el("dd", {}, fmtTime(job.finished_at)))),
    job.error && job.error.message ? el("p", { class: "error-text small" }, job.error.message) : null);
}
