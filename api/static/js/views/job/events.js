// The lifecycle events (status changes, checkpoints, evaluations, warnings; GET /events?type=message),
// newest first and capped; events from the stream are merged in as they come. Per-step metrics are
// the charts' business, not this list's.

import { clear, el, fmtTime } from "../../util.js";

const MAX_EVENTS = 200; // rows in the events log

function eventItem(e) {
  return el("li", { class: `event level-${e.level || "info"}`, dataset: { id: e.id || "" } },
    el("time", {}, fmtTime(e.created_at)), el("span", {}, e.message || ""));
}

export function eventsCard() {
  const list = el("ol", { class: "events", id: "events" });
  const node = el("section", { class: "card", "aria-labelledby": "ev-h" }, el("h2", { id: "ev-h" }, "Events"), list);
  let events = []; // newest first, by (created_at, arrival)

  function paint() {
    clear(list, events.length ? events.map(eventItem) : el("li", { class: "muted" }, "No events yet."));
  }

  return {
    node,
    /** The page of lifecycle events from /events (newest first), merged with those streamed since. */
    render(page) {
      const ids = new Set(page.map((e) => e.id));
      const newer = events.filter((e) => !ids.has(e.id) && e.created_at > (page[0]?.created_at ?? 0));
      events = [...newer, ...page.filter((e) => e.type !== "metrics")].slice(0, MAX_EVENTS);
      paint();
    },
    /** One event from the stream. */
    prepend(e) {
      if (e.type === "metrics" || events.some((x) => x.id === e.id)) return;
      events = [e, ...events].sort((a, b) => (b.created_at ?? 0) - (a.created_at ?? 0)).slice(0, MAX_EVENTS);
      paint();
    },
    all: () => events,
  };
}
