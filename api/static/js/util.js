// DOM and formatting helpers. el() builds elements with text nodes only (never innerHTML from
// data), so ids, file names and generated text cannot inject markup. A `style` is set through the
// CSSOM (node.style), which the server's Content-Security-Policy allows; a style attribute is not.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else if (k === "style") node.style.cssText = String(v);
    else if (v === true) node.setAttribute(k, "");
    else node.setAttribute(k, String(v));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function clear(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

// Display text only: which statuses are terminal, claimable or active is the API's answer (served.js).
export const STATUS_LABEL = {
  validating_files: "validating", queued: "queued", running: "running", paused: "paused",
  succeeded: "succeeded", failed: "failed", cancelled: "cancelled",
};

export function badge(status) {
  return el("span", { class: `badge badge-${status || "unknown"}`, dataset: { status: status || "" } },
    STATUS_LABEL[status] || status || "unknown");
}

export function fmtTime(ts) {
  if (typeof ts !== "number" || ts <= 0) return "—";
  const d = new Date(ts * 1000);
  const today = new Date();
  const sameDay = d.toDateString() === today.toDateString();
  const time = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  return sameDay ? time : `${d.toLocaleDateString([], { month: "short", day: "numeric" })} ${time}`;
}

export function fmtDuration(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds < 0) return "—";
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m ${String(r).padStart(2, "0")}s`;
  return `${r}s`;
}

export function fmtLoss(v) {
  return typeof v === "number" && Number.isFinite(v) ? v.toFixed(4) : "—";
}

export function fmtInt(v) {
  return typeof v === "number" && Number.isFinite(v) ? Math.round(v).toLocaleString("en-US") : "—";
}

export function fmtBytes(n) {
  if (typeof n !== "number") return "—";
  const units = ["B", "kB", "MB", "GB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return i ? `${n.toFixed(1)} ${units[i]}` : `${n} B`;
}

/** A <progress>-like bar that stays readable: a track, a fill and a text label. */
export function progressBar(value, max, label) {
  const pct = max ? Math.max(0, Math.min(100, (100 * value) / max)) : 0;
  const bar = el("div", {
    class: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": max || 0, "aria-valuenow": value || 0,
    "aria-label": label,
  }, el("div", { class: "bar-fill", style: `width:${pct.toFixed(1)}%` }));
  return bar;
}

export function setProgress(bar, value, max) {
  const pct = max ? Math.max(0, Math.min(100, (100 * value) / max)) : 0;
  bar.setAttribute("aria-valuenow", value || 0);
  bar.setAttribute("aria-valuemax", max || 0);
  bar.firstChild.style.width = `${pct.toFixed(1)}%`;
}

let toastTimer = null;
/** A short message in the live region at the bottom of the page. */
export function toast(message, kind = "info") {
  const node = document.getElementById("toast");
  if (!node) return;
  node.textContent = message;
  node.className = `toast toast-${kind} show`;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { node.className = "toast"; }, 5000);
}

export const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  if (signal) signal.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
});

/** Call fn() each time the page is shown again (its tab becomes visible, its window gets the focus:
 *  the user may have deleted something elsewhere meanwhile), until `signal` aborts (the view goes). */
export function onShownAgain(fn, signal) {
  const shown = () => { if (document.visibilityState !== "hidden") fn(); };
  document.addEventListener("visibilitychange", shown, { signal });
  window.addEventListener("focus", shown, { signal });
}
