// Hash routes: #/jobs[?after=ID], #/jobs/<id>, #/new[?clone=ID],
// #/playground[?model=ID&mode=chat|completion], #/compare[?jobs=ID,ID,...], #/signin; a route opened
// signed out shows the sign-in, then itself. Each view is mounted into <main> and returns {destroy()}
// so its timers, streams and charts stop when the route changes. Signed-in views get the statuses
// the API serves (fetched once after sign-in, see served.js).

import { clearKey, getKey, onUnauthorized } from "./api.js";
import { forgetServed, loadStatuses } from "./served.js";
import { el } from "./util.js";
import { mountCompare } from "./views/compare.js";
import { mountJob } from "./views/job.js";
import { mountJobs } from "./views/jobs.js";
import { mountNewJob } from "./views/newjob.js";
import { mountPlayground } from "./views/playground.js";
import { mountSignIn } from "./views/signin.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
let current = null;
let notice = null;
let routing = 0; // which route() call is the latest: an older one still waiting on the API gives up

function parse(hash) {
  const [path, qs] = (hash.replace(/^#/, "") || "/jobs").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(qs || "") };
}

async function route() {
  const seq = ++routing;
  if (current) { current.destroy(); current = null; }
  main.replaceChildren();
  const { parts, params } = parse(location.hash);
  const signedIn = !!getKey();
  nav.hidden = !signedIn;
  if (!signedIn || parts[0] === "signin") {
    if (signedIn && parts[0] === "signin") { location.hash = "#/jobs"; return; }
    current = mountSignIn(main, { notice });
    notice = null;
    return;
  }
  const section = ["new", "playground", "compare"].includes(parts[0]) ? parts[0] : "jobs";
  for (const a of nav.querySelectorAll("a[data-route]")) {
    const active = a.dataset.route === section && !(parts[0] === "jobs" && parts[1]);
    if (active) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  document.title = "fromscratch";
  let statuses;
  try {
    statuses = await loadStatuses();
  } catch (e) {
    // a 401 has already sent the user to the sign-in page (onUnauthorized)
    if (seq === routing && e.status !== 401) showUnreachable(e);
    return;
  }
  if (seq !== routing) return;
  if (parts[0] === "new") current = mountNewJob(main, { params });
  else if (parts[0] === "playground") current = mountPlayground(main, { params });
  else if (parts[0] === "compare") current = mountCompare(main, { params, statuses });
  else if (parts[0] === "jobs" && parts[1]) current = mountJob(main, { id: parts[1], statuses });
  else current = mountJobs(main, { after: params.get("after") || undefined, statuses });
}

function showUnreachable(error) {
  const retry = el("button", { type: "button", class: "secondary", onclick: () => route() }, "Try again");
  main.append(el("div", { class: "error-banner", role: "alert" },
    `Could not read the job statuses from the API: ${error.message}. `, retry));
}

onUnauthorized(() => {
  if (!getKey()) return;
  clearKey();
  forgetServed();
  notice = "Your API key was refused (401 Unauthorized): it may have been revoked. Sign in again.";
  route();
});

document.getElementById("sign-out").addEventListener("click", () => {
  clearKey();
  forgetServed();
  notice = "Signed out.";
  location.hash = "#/signin";
});

window.addEventListener("hashchange", () => { route(); main.focus({ preventScroll: true }); });
route();
