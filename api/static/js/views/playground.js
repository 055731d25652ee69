// Playground: try one of your models with streamed chat or completions. The pieces in playground/:
//   models.js (the picker, GET /v1/models)    chat.js, completion.js (the two modes' panes)
//   sampling.js (max_tokens … stop)           stream.js (the SSE reader)    stats.js (usage, tokens/s)
// Address: #/playground?model=ID&mode=chat|completion, kept current as they change (no reload).
// Stop aborts the request (the server sees the connection close); leaving the page does too.

import { el } from "../util.js";
import { chatPane } from "./playground/chat.js";
import { completionPane } from "./playground/completion.js";
import { modelPicker } from "./playground/models.js";
import { samplingFields } from "./playground/sampling.js";
import { runStats } from "./playground/stats.js";
import { streamCompletion } from "./playground/stream.js";

const MODES = { chat: "Chat", completion: "Completion" };

export function mountPlayground(root, { params }) {
  const page = new AbortController();
  let run = null; // the AbortController of the request in flight
  let mode = params.get("mode") === "completion" ? "completion" : "chat";

  const panes = { chat: chatPane({ onSubmit: start }), completion: completionPane() };
  const sampling = samplingFields();
  const stats = runStats();
  const picker = modelPicker({ preselect: params.get("model"), signal: page.signal, onChange: modelChosen });
  const errorBox = el("div", { class: "error-banner", role: "alert", id: "pg-error", hidden: true });
  const noModels = el("p", { class: "notice", hidden: true }, "You have no trained models yet: ",
    el("a", { href: "#/new" }, "start a training job"), " and come back once it has saved a checkpoint.");
  const modeInputs = Object.entries(MODES).map(([value, label]) => el("label", { class: "pg-mode" },
    el("input", { type: "radio", name: "pg-mode", value, checked: value === mode, onchange: () => setMode(value) }),
    label));
  const submit = el("button", { type: "submit", class: "primary", disabled: true });
  const stop = el("button", { type: "button", class: "secondary", disabled: true, onclick: () => run && run.abort() },
    "Stop");
  const clear = el("button", { type: "button", class: "secondary", onclick: clearPane }, "Clear");

  const form = el("form", { class: "card pg-main", "aria-label": "Playground" },
    el("div", { class: "pg-top" },
      el("div", { class: "field" }, el("label", { for: "pg-model" }, "Model or checkpoint"), picker.node),
      el("fieldset", { class: "pg-modes" }, el("legend", {}, "Mode"), modeInputs)),
    noModels,
    panes.chat.node,
    panes.completion.node,
    errorBox,
    el("div", { class: "actions" }, submit, stop, clear),
    stats.node);
  form.addEventListener("submit", (ev) => { ev.preventDefault(); start(); });
  form.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); start(); }
  });
  root.append(
    el("div", { class: "page-head" }, el("div", {},
      el("h1", {}, "Playground"),
      el("p", { class: "muted small pg-intro" }, "Chat with one of your models or let it continue a prompt; the answer streams in."))),
    el("div", { class: "playground" }, form, sampling.node));
  document.title = "Playground · fromscratch";
  setMode(mode);

  picker.load().then((count) => {
    noModels.hidden = count > 0 || !!picker.node.value;
  }, (e) => {
    if (e.name !== "AbortError") showError(`Could not load your models: ${e.message}`);
  });

  // -- state ------------------------------------------------------------------------------------
  function setMode(value) {
    mode = value;
    for (const [name, pane] of Object.entries(panes)) pane.node.hidden = name !== mode;
    submit.textContent = panes[mode].submitLabel;
    clear.textContent = mode === "chat" ? "Clear conversation" : "Clear";
    stats.clear(); // the last run's figures belong to the other pane
    errorBox.hidden = true;
    syncAddress();
  }

  function modelChosen() {
    picker.node.removeAttribute("aria-invalid");
    setBusy(false);
    syncAddress();
  }

  function syncAddress() {
    const q = new URLSearchParams();
    if (picker.node.value) q.set("model", picker.node.value);
    q.set("mode", mode);
    history.replaceState(history.state, "", `#/playground?${q}`);
  }

  function setBusy(busy) {
    form.setAttribute("aria-busy", String(busy));
    submit.disabled = busy || !picker.node.value;
    stop.disabled = !busy;
    clear.disabled = busy;
    picker.node.disabled = busy || !picker.node.value;
    for (const label of modeInputs) label.firstChild.disabled = busy;
  }

  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = false;
  }

  function clearPane() {
    panes[mode].clear();
    errorBox.hidden = true;
    stats.clear();
    panes[mode].focus();
  }

  // -- a run ------------------------------------------------------------------------------------
  async function start() {
    const model = picker.node.value;
    if (run || !model) return;
    const pane = panes[mode];
    const part = pane.request();
    if (!part) return;
    errorBox.hidden = true;
    sampling.markInvalid(null);
    const body = { model, ...part, ...sampling.values(), stream: true, stream_options: { include_usage: true } };
    run = new AbortController();
    setBusy(true);
    const sink = pane.begin();
    stats.start();
    try {
      const result = await streamCompletion(pane.path, body, {
        signal: run.signal,
        onText(text) { sink.append(text); stats.chunk(); },
      });
      sink.end("done");
      stats.finish("done", result);
    } catch (e) {
      const stopped = e.name === "AbortError";
      sink.end(stopped ? "stopped" : "error");
      stats.finish(stopped ? "stopped" : "error");
      if (!stopped) failed(e);
    } finally {
      run = null;
      if (!page.signal.aborted) setBusy(false);
    }
  }

  /** The API's message, and the control it names marked (error.param). */
  function failed(e) {
    showError(e.code ? `${e.message} (${e.code})` : e.message);
    if (e.param === "model") picker.node.setAttribute("aria-invalid", "true");
    else sampling.markInvalid(e.param);
  }

  return {
    destroy() {
      page.abort();
      if (run) run.abort();
    },
  };
}
