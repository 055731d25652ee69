// The events log: the job's events newest first (capped), the latest metrics line on top, and
// events from the stream prepended as they come.

import { clear, el, fmtTime } from "../../util.js";

const MAX_EVENTS = 200; // rows in the events log

function eventItem(e) {
  return el("li", { class: `event level-${e.level || "info"}` }, el("time", {}, fmtTime(e.created_at)),
    el("span", {}, e.message || ""));
}

export function eventsCard() {
  const list = el("ol", { class: "events", id: "events" });
  const node = el("section", { class: "card", "aria-labelledby": "ev-h" }, el("h2", { id: "ev-h" }, "Events"), list);
  return {
    node,
    /** The page of events from /events (newest first). */
    render(events) {
      const shown = events.filter((e) => e.type !== "metrics").slice(0, MAX_EVENTS);
      const latestMetrics = events.find((e) => e.type === "metrics");
      clear(list,
        latestMetrics ? el("li", { class: "event level-info" }, el("time", {}, fmtTime(latestMetrics.created_at)),
          el("span", {}, latestMetrics.message || "metrics")) : null,
        shown.map(eventItem),
        !shown.length && !latestMetrics ? el("li", { class: "muted" }, "No events yet.") : null);
    },
    /** One event from the stream. */
    prepend(e) {
      if (list.firstChild && list.firstChild.classList.contains("muted")) list.firstChild.remove();
      list.prepend(eventItem(e));
      while (list.childElementCount > MAX_EVENTS) list.lastChild.remove();
    },
  };
}
