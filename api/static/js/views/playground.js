// Playground: try one of your models with streamed chat or completions. The pieces in playground/:
//   models.js (the picker, GET /v1/models)    chat.js, completion.js (the two modes' panes)
//   sampling.js (max_tokens … stop)           stream.js (the SSE reader)    stats.js (usage, tokens/s)
// Address: #/playground?model=ID&mode=chat|completion, kept current as they change (no reload).
// Without a mode in the address, the mode follows the model: chat for one trained on conversations,
// completion otherwise (playground/data_kind.js), until the user picks one.
// Stop aborts the request (the server sees the connection close); leaving the page does too.
// The model list is read again whenever the page is shown again (a model deleted elsewhere goes).

import { el, onShownAgain } from "../util.js";
import { chatPane } from "./playground/chat.js";
import { completionPane } from "./playground/completion.js";
import { modelDataKind } from "./playground/data_kind.js";
import { modelPicker } from "./playground/models.js";
import { samplingFields } from "./playground/sampling.js";
import { runStats } from "./playground/stats.js";
import { streamRun } from "./playground/stream.js";

const MODES = { chat: "Chat", completion: "Completion" };

export function mountPlayground(root, { params }) {
  const playground = new Playground(params);
  root.append(
    el("div", { class: "page-head" }, el("div", {},
      el("h1", {}, "Playground"),
      el("p", { class: "muted small pg-intro" }, "Chat with one of your models or let it continue a prompt; the answer streams in."))),
    el("div", { class: "playground" }, playground.form, playground.sampling.node));
  document.title = "Playground · fromscratch";
  playground.setMode(playground.mode);
  playground.loadModels();
  onShownAgain(() => { if (!playground.run) playground.loadModels(); }, playground.page.signal);
  return { destroy() { playground.destroy(); } };
}

/** The playground's form, its state (the mode, the run in flight) and a run. */
class Playground {
  constructor(params) {
    this.page = new AbortController();
    this.run = null; // the AbortController of the request in flight
    const asked = params.get("mode");
    this.modeChosen = Object.hasOwn(MODES, asked ?? ""); // by the address (or, later, the user)
    this.mode = asked === "chat" ? "chat" : "completion";
    this.modeGuessedFor = null; // the model whose data the mode was last chosen by
    this.panes = { chat: chatPane({ onSubmit: () => this.start() }), completion: completionPane() };
    this.sampling = samplingFields();
    this.stats = runStats();
    this.picker = modelPicker({ preselect: params.get("model"), signal: this.page.signal,
      onChange: () => this.modelChosen() });
    this.errorBox = el("div", { class: "error-banner", role: "alert", id: "pg-error", hidden: true });
    this.noModels = el("p", { class: "notice", hidden: true }, "You have no trained models yet: ",
      el("a", { href: "#/new" }, "start a training job"), " and come back once it has saved a checkpoint.");
    this.#createButtons();
    this.form = this.#createForm();
  }

  #createButtons() {
    this.modeInputs = Object.entries(MODES).map(([value, label]) => el("label", { class: "pg-mode" },
      el("input", { type: "radio", name: "pg-mode", value, checked: value === this.mode,
        onchange: () => { this.modeChosen = true; this.setMode(value); } }),
      label));
    this.submitButton = el("button", { type: "submit", class: "primary", disabled: true });
    this.stopButton = el("button", { type: "button", class: "secondary", disabled: true,
      onclick: () => this.run && this.run.abort() }, "Stop");
    this.clearButton = el("button", { type: "button", class: "secondary", onclick: () => this.clearPane() }, "Clear");
  }

  #createForm() {
    const form = el("form", { class: "card pg-main", "aria-label": "Playground" },
      el("div", { class: "pg-top" },
        el("div", { class: "field" }, el("label", { for: "pg-model" }, "Model or checkpoint"), this.picker.node),
        el("fieldset", { class: "pg-modes" }, el("legend", {}, "Mode"), this.modeInputs)),
      this.noModels,
      this.panes.chat.node,
      this.panes.completion.node,
      this.errorBox,
      el("div", { class: "actions" }, this.submitButton, this.stopButton, this.clearButton),
      this.stats.node);
    form.addEventListener("submit", (ev) => { ev.preventDefault(); this.start(); });
    form.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); this.start(); }
    });
    return form;
  }

  loadModels() {
    this.picker.load().then((count) => {
      this.noModels.hidden = count > 0 || !!this.picker.node.value;
    }, (e) => {
      if (e.name !== "AbortError") this.showError(`Could not load your models: ${e.message}`);
    });
  }

  // -- state ------------------------------------------------------------------------------------
  setMode(value) {
    this.mode = value;
    for (const label of this.modeInputs) label.firstChild.checked = label.firstChild.value === value;
    for (const [name, pane] of Object.entries(this.panes)) pane.node.hidden = name !== this.mode;
    this.submitButton.textContent = this.panes[this.mode].submitLabel;
    this.clearButton.textContent = this.mode === "chat" ? "Clear conversation" : "Clear";
    this.stats.clear(); // the last run's figures belong to the other pane
    this.errorBox.hidden = true;
    this.syncAddress();
  }

  modelChosen() {
    this.picker.node.removeAttribute("aria-invalid");
    this.setBusy(false);
    this.syncAddress();
    this.followModelData();
  }

  /** Unless a mode was chosen: chat for a model trained on conversations, completion otherwise.
   *  The form's data-mode-for names the model the mode was set by, once it is. */
  async followModelData() {
    const id = this.picker.node.value;
    if (this.modeChosen || !id || id === this.modeGuessedFor) return;
    this.modeGuessedFor = id;
    const kind = await modelDataKind(this.picker.model(id), this.page.signal).catch(() => null);
    if (!kind || this.modeChosen || this.run || this.picker.node.value !== id) return;
    const mode = kind === "chat" ? "chat" : "completion";
    if (mode !== this.mode) this.setMode(mode);
    this.form.dataset.modeFor = id;
  }

  syncAddress() {
    const q = new URLSearchParams();
    if (this.picker.node.value) q.set("model", this.picker.node.value);
    if (this.modeChosen) q.set("mode", this.mode); // else a reload lets the model's data decide again
    history.replaceState(history.state, "", `#/playground?${q}`);
  }

  setBusy(busy) {
    this.form.setAttribute("aria-busy", String(busy));
    this.submitButton.disabled = busy || !this.picker.node.value;
    this.stopButton.disabled = !busy;
    this.clearButton.disabled = busy;
    this.picker.node.disabled = busy || !this.picker.node.value;
    for (const label of this.modeInputs) label.firstChild.disabled = busy;
  }

  showError(message) {
    this.errorBox.textContent = message;
    this.errorBox.hidden = false;
  }

  clearPane() {
    this.panes[this.mode].clear();
    this.errorBox.hidden = true;
    this.stats.clear();
    this.panes[this.mode].focus();
  }

  // -- a run ------------------------------------------------------------------------------------
  async start() {
    const model = this.picker.node.value;
    if (this.run || !model) return;
    const pane = this.panes[this.mode];
    const part = pane.request();
    if (!part) return;
    this.errorBox.hidden = true;
    this.sampling.markInvalid(null);
    const body = { model, ...part, ...this.sampling.values() };
    this.run = new AbortController();
    this.setBusy(true);
    const { error } = await streamRun(pane.path, body, { signal: this.run.signal, sink: pane.begin(), stats: this.stats });
    if (error) this.failed(error);
    this.run = null;
    if (!this.page.signal.aborted) this.setBusy(false);
  }

  /** The API's message, and the control it names marked (error.param). */
  failed(e) {
    this.showError(e.code ? `${e.message} (${e.code})` : e.message);
    if (e.param === "model") this.picker.node.setAttribute("aria-invalid", "true");
    else this.sampling.markInvalid(e.param);
  }

  destroy() {
    this.page.abort();
    if (this.run) this.run.abort();
  }
}
