// Compare runs (#/compare?jobs=a,b,c), as in W&B or TensorBoard: the jobs' loss and token-accuracy
// curves overlaid, one colour per run, smoothed with a debiased EMA (raw curves faint behind), x by
// step or tokens seen; the runs as a legend; their hyperparameters side by side with the differences
// highlighted. Live runs are polled until they end. The pieces live in compare/:
//   runs.js (data)   panels.js + ema.js (charts)   controls.js   legend.js   hparams.js   picker.js

import { el, sleep } from "../util.js";
import { compareControls } from "./compare/controls.js";
import { hyperparameterTable } from "./compare/hparams.js";
import { runsLegend } from "./compare/legend.js";
import { comparePanels } from "./compare/panels.js";
import { runPicker } from "./compare/picker.js";
import { MAX_RUNS, Run, compareHash, labelRuns, loadRun, parseJobIds, pollRun } from "./compare/runs.js";

const POLL_MS = 3000;

/** params: the route's query (jobs=a,b,c); statuses: the served status sets (served.js). */
export function mountCompare(root, { params, statuses }) {
  const abort = new AbortController();
  const signal = abort.signal;
  const { ids, given } = parseJobIds(params.get("jobs"));
  const view = el("div", { class: "compare", id: "compare", dataset: { state: "loading" } });
  root.append(view);
  headAndPicker(view, { ids, given, signal });
  if (!ids.length) return { destroy() { abort.abort(); } };

  const runs = ids.map((id, i) => new Run(id, i));
  const board = runsBoard(view, runs);
  document.title = "Compare runs · fromscratch";
  // the runs' colours follow the colour scheme: redraw when it changes
  const scheme = matchMedia("(prefers-color-scheme: dark)");
  scheme.addEventListener("change", board.draw);
  followRuns(runs, { board, view, statuses, signal });
  return { destroy() { abort.abort(); board.destroy(); scheme.removeEventListener("change", board.draw); } };
}

/** The heading, a notice when jobs were left out, and the run picker: open at once when no runs
 *  are chosen, else folded behind "Choose runs". */
function headAndPicker(view, { ids, given, signal }) {
  const choose = el("button", { type: "button", class: "secondary", id: "cmp-choose", "aria-expanded": "false" }, "Choose runs");
  view.append(el("div", { class: "page-head" }, el("h1", {}, "Compare runs"), ids.length ? choose : null));
  if (given > ids.length) {
    view.append(el("p", { class: "notice", role: "status" }, `Showing the first ${MAX_RUNS} of the ${given} jobs asked for.`));
  }
  const picker = runPicker({ chosen: ids, signal });
  view.append(picker.node);
  if (!ids.length) {
    picker.load();
    return;
  }
  picker.node.hidden = true;
  choose.addEventListener("click", () => {
    picker.node.hidden = !picker.node.hidden;
    if (!picker.node.hidden) picker.load();
    choose.setAttribute("aria-expanded", String(!picker.node.hidden));
  });
}

/** The runs' legend (removing a run reopens the page without it), charts and hyperparameters;
 *  draw() shows the runs as they are now. */
function runsBoard(view, runs) {
  const legend = runsLegend((run) => {
    const rest = runs.filter((r) => r !== run).map((r) => r.id);
    location.hash = rest.length ? compareHash(rest) : "#/compare";
  });
  const panels = comparePanels();
  const controls = compareControls(() => draw());
  const hparams = hyperparameterTable();
  view.append(legend.node, controls.node, ...panels.nodes, hparams.node);
  panels.mount(() => draw());

  function draw() {
    labelRuns(runs);
    legend.render(runs);
    panels.update(runs, controls.settings());
    hparams.render(runs);
  }

  return { legend, draw, destroy() { panels.destroy(); } };
}

/** Load the runs, then poll the live ones until every run has ended (or the page goes away). */
async function followRuns(runs, { board, view, statuses, signal }) {
  const live = (run) => run.job && !statuses.terminal.has(run.job.status);
  board.legend.render(runs);
  try {
    await Promise.all(runs.map((run) => loadRun(run, signal)));
  } catch {
    return; // the page went away
  }
  board.draw();
  view.dataset.state = "loaded";
  while (!signal.aborted && runs.some(live)) {
    await sleep(POLL_MS, signal);
    if (signal.aborted) return;
    await Promise.all(runs.filter(live).map((run) => pollRun(run, signal).catch((e) => {
      if (e.name !== "AbortError") console.warn(`polling ${run.id} failed:`, e.message); // next round
    })));
    if (!signal.aborted) board.draw();
  }
  if (!signal.aborted) view.dataset.state = "done"; // every run has ended: nothing more to poll
}
