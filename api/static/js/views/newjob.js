// New job: upload (or pick) a training file, choose a preset and hyperparameters (the trainer's
// defaults shown), create the job. Only the fields changed from their defaults are sent. An API
// validation error is shown next to the field its `error.param` names.

import { api, ApiError, uploadFile } from "../api.js";
import { NULL_MEANS, presetValues, PRESETS, TRAIN_DEFAULTS } from "../defaults.js";
import { clear, el, fmtBytes, fmtTime, progressBar, setProgress, toast } from "../util.js";

// name, label, kind (int|float|choice|bool), choices, where it goes (arch → architecture from the preset)
const FIELDS = [
  // architecture (defaults follow the preset)
  { name: "n_layer", label: "Layers", kind: "int", arch: true, group: "arch" },
  { name: "n_head", label: "Attention heads", kind: "int", arch: true, group: "arch" },
  { name: "n_kv_head", label: "KV heads (GQA)", kind: "int", arch: true, group: "arch" },
  { name: "n_embd", label: "Embedding size", kind: "int", arch: true, group: "arch" },
  { name: "ctx", label: "Context length", kind: "int", arch: true, group: "arch" },
  // training
  { name: "max_steps", label: "Max steps", kind: "int", group: "train" },
  { name: "batch_size", label: "Batch size", kind: "int", group: "train" },
  { name: "learning_rate", label: "Learning rate", kind: "float", group: "train" },
  { name: "warmup_steps", label: "Warmup steps", kind: "int", group: "train" },
  { name: "schedule", label: "LR schedule", kind: "choice", choices: ["cosine", "cosine-restarts", "constant"], group: "train" },
  { name: "eval_every", label: "Eval every", kind: "int", group: "train" },
  { name: "checkpoint_every", label: "Checkpoint every", kind: "int", group: "train" },
  { name: "tokenizer", label: "Tokenizer", kind: "choice", choices: ["byte", "bpe"], group: "train" },
  { name: "vocab_size", label: "Vocab size (bpe)", kind: "int", group: "train" },
  { name: "seed", label: "Seed", kind: "int", group: "train", top: true },
  // advanced
  { name: "n_epochs", label: "Epochs", kind: "int", group: "adv" },
  { name: "grad_accum", label: "Gradient accumulation", kind: "int", group: "adv" },
  { name: "optimizer", label: "Optimizer", kind: "choice", choices: ["adamw", "lbfgs"], group: "adv" },
  { name: "min_lr", label: "Min learning rate", kind: "float", group: "adv" },
  { name: "weight_decay", label: "Weight decay", kind: "float", group: "adv" },
  { name: "grad_clip", label: "Gradient clip (0 = off)", kind: "float", group: "adv" },
  { name: "beta1", label: "Adam β1", kind: "float", group: "adv" },
  { name: "beta2", label: "Adam β2", kind: "float", group: "adv" },
  { name: "eps", label: "Adam ε", kind: "float", group: "adv" },
  { name: "cos_decay_steps", label: "Cosine cycle (steps)", kind: "int", group: "adv" },
  { name: "cos_decay_restart", label: "Cycle growth", kind: "float", group: "adv" },
  { name: "cos_decay_alpha", label: "Cosine floor (× LR)", kind: "float", group: "adv" },
  { name: "eval_batches", label: "Eval batches", kind: "int", group: "adv" },
  { name: "val_fraction", label: "Validation fraction", kind: "float", group: "adv" },
  { name: "keep_checkpoints", label: "Checkpoints kept", kind: "int", group: "adv" },
  { name: "log_every", label: "Log every (steps)", kind: "int", group: "adv" },
  { name: "time_limit", label: "Time limit (s)", kind: "float", group: "adv" },
  { name: "device", label: "Device", kind: "choice", choices: ["auto", "cpu", "cuda"], group: "adv" },
  { name: "dtype", label: "Dtype", kind: "choice", choices: ["auto", "float32", "bfloat16", "float16"], group: "adv" },
  { name: "samples_after_nl", label: "Start samples after a newline", kind: "bool", group: "adv" },
  { name: "activation_checkpointing", label: "Activation checkpointing", kind: "bool", group: "adv" },
  { name: "compile", label: "torch.compile", kind: "bool", group: "adv" },
  { name: "rope_theta", label: "RoPE θ", kind: "float", arch: true, group: "adv" },
  { name: "rope_dims", label: "RoPE dims", kind: "int", arch: true, group: "adv" },
  { name: "ffn_dim", label: "FFN size", kind: "int", arch: true, group: "adv" },
  { name: "multiple_of", label: "FFN multiple of", kind: "int", arch: true, group: "adv" },
  { name: "norm_eps", label: "RMSNorm ε", kind: "float", arch: true, group: "adv" },
  { name: "tie_embeddings", label: "Tie embeddings", kind: "bool", arch: true, group: "adv" },
];

const fieldId = (name) => `hp-${name}`;

export function mountNewJob(root) {
  const abort = new AbortController();
  const inputs = new Map(); // name -> input element
  const errors = new Map(); // param name -> error <p>

  function errorSlot(name) {
    const p = el("p", { id: `err-${name}`, class: "field-error", role: "alert", dataset: { param: name } });
    errors.set(name, p);
    return p;
  }

  // -- files ------------------------------------------------------------------------------
  const fileSelect = el("select", { id: "training_file", name: "training_file", "aria-describedby": "err-training_file" },
    el("option", { value: "" }, "— choose an uploaded file —"));
  const valSelect = el("select", { id: "validation_file", name: "validation_file", "aria-describedby": "err-validation_file" },
    el("option", { value: "" }, "none (hold out the end of the training file)"));
  const fileInput = el("input", { id: "upload", type: "file", accept: ".txt,.jsonl,.json,.md,text/plain,application/jsonl" });
  const uploadBar = progressBar(0, 1, "Upload progress");
  const uploadText = el("span", { class: "small", role: "status" }, "");
  const uploadBox = el("div", { class: "upload-progress", hidden: true }, uploadBar, uploadText);

  async function loadFiles(selectId) {
    try {
      const page = await api("/files", { signal: abort.signal });
      const files = (page.data || []).slice().sort((a, b) => (b.created_at || 0) - (a.created_at || 0));
      for (const sel of [fileSelect, valSelect]) {
        const keep = sel.value;
        clear(sel, sel.firstChild);
        for (const f of files) {
          sel.append(el("option", { value: f.id },
            `${f.filename || f.id} · ${fmtBytes(f.bytes)} · ${fmtTime(f.created_at)} (${f.id})`));
        }
        sel.value = keep;
      }
      if (selectId) fileSelect.value = selectId;
    } catch (e) {
      if (e.name !== "AbortError") showFieldError("training_file", `Could not list files: ${e.message}`);
    }
  }

  fileInput.addEventListener("change", async () => {
    const file = fileInput.files && fileInput.files[0];
    if (!file) return;
    setError("training_file", "");
    uploadBox.hidden = false;
    uploadBox.classList.remove("done");
    setProgress(uploadBar, 0, file.size);
    uploadText.textContent = `Uploading ${file.name}: 0 of ${fmtBytes(file.size)}`;
    try {
      const obj = await uploadFile(file, {
        signal: abort.signal,
        onProgress: (loaded, total) => {
          setProgress(uploadBar, loaded, total);
          uploadText.textContent = `Uploading ${file.name}: ${fmtBytes(loaded)} of ${fmtBytes(total)}`;
        },
      });
      setProgress(uploadBar, 1, 1);
      uploadBox.classList.add("done");
      uploadText.textContent = `Uploaded ${obj.filename || file.name} (${fmtBytes(obj.bytes)}) as ${obj.id}`;
      await loadFiles(obj.id);
      fileSelect.value = obj.id;
    } catch (e) {
      if (e.name === "AbortError") return;
      uploadText.textContent = "Upload failed.";
      showFieldError("training_file", e.message);
    } finally {
      fileInput.value = "";
    }
  });

  // -- preset and hyperparameters -----------------------------------------------------------
  const presetSelect = el("select", { id: "model", name: "model", "aria-describedby": "err-model" },
    Object.keys(PRESETS).map((name) => el("option", { value: name }, name)));
  const suffix = el("input", { id: "suffix", name: "suffix", type: "text", maxlength: 40, placeholder: "optional",
    "aria-describedby": "err-suffix" });

  function defaultFor(f) {
    if (f.arch) return presetValues(presetSelect.value)[f.name];
    return TRAIN_DEFAULTS[f.name];
  }

  function fieldControl(f) {
    const id = fieldId(f.name);
    let input;
    if (f.kind === "choice") {
      input = el("select", { id, name: f.name }, f.choices.map((c) => el("option", { value: c }, c)));
    } else if (f.kind === "bool") {
      input = el("input", { id, name: f.name, type: "checkbox" });
    } else {
      input = el("input", { id, name: f.name, type: "text", inputmode: f.kind === "int" ? "numeric" : "decimal",
        autocomplete: "off", spellcheck: "false" });
    }
    input.setAttribute("aria-describedby", `err-${f.name}`);
    inputs.set(f.name, input);
    const wrap = el("div", { class: f.kind === "bool" ? "field field-check" : "field", dataset: { field: f.name } });
    if (f.kind === "bool") wrap.append(input, el("label", { for: id }, f.label));
    else wrap.append(el("label", { for: id }, f.label, el("span", { class: "param-name" }, f.name)), input);
    wrap.append(errorSlot(f.name));
    return wrap;
  }

  function showValue(f) {
    const input = inputs.get(f.name);
    const d = defaultFor(f);
    if (f.kind === "bool") input.checked = !!d;
    else if (f.kind === "choice") input.value = d;
    else {
      input.value = d === null || d === undefined ? "" : String(d);
      input.placeholder = d === null || d === undefined ? (NULL_MEANS[f.name] || "default") : "";
    }
    input.dataset.default = d === null || d === undefined ? "" : String(d);
  }

  const byGroup = (g) => FIELDS.filter((f) => f.group === g).map(fieldControl);
  const archSet = el("fieldset", { class: "grid" }, el("legend", {}, "Architecture (from the preset)"), byGroup("arch"));
  const trainSet = el("fieldset", { class: "grid" }, el("legend", {}, "Training"), byGroup("train"));
  const advanced = el("details", { class: "advanced" }, el("summary", {}, "Advanced hyperparameters"),
    el("div", { class: "grid" }, byGroup("adv")));
  FIELDS.forEach(showValue);
  presetSelect.addEventListener("change", () => {
    // the architecture follows the preset unless the user typed something else
    for (const f of FIELDS.filter((x) => x.arch)) {
      const input = inputs.get(f.name);
      const untouched = f.kind === "bool" ? String(input.checked) === String(input.dataset.default === "true")
        : input.value === input.dataset.default;
      if (untouched) showValue(f);
    }
  });

  function parseValue(f) {
    const input = inputs.get(f.name);
    if (f.kind === "bool") return input.checked;
    if (f.kind === "choice") return input.value;
    const text = input.value.trim();
    if (text === "") return null;
    if (text === "auto" && (f.name === "n_epochs" || f.name === "batch_size")) return "auto";
    const n = Number(text);
    return Number.isFinite(n) ? n : text; // the API names what is wrong with a non-number
  }

  // -- errors -------------------------------------------------------------------------------
  const formError = el("div", { class: "error-banner", role: "alert", hidden: true });

  function setError(name, message) {
    const slot = errors.get(name);
    if (slot) slot.textContent = message;
    const input = name === "training_file" ? fileSelect : name === "model" ? presetSelect
      : name === "validation_file" ? valSelect : name === "suffix" ? suffix : inputs.get(name);
    if (input) {
      if (message) input.setAttribute("aria-invalid", "true"); else input.removeAttribute("aria-invalid");
    }
    return input;
  }

  function clearErrors() {
    for (const name of errors.keys()) setError(name, "");
    formError.hidden = true;
    formError.textContent = "";
  }

  /** Show an error next to the field `param` names: "hyperparameters.n_embd",
   *  "method.supervised.hyperparameters.n_embd", "training_file", ... Falls back to the banner. */
  function showFieldError(param, message) {
    const parts = String(param || "").split(".");
    const candidates = [param, parts[parts.length - 1], parts[0]];
    for (const name of candidates) {
      if (name && errors.has(name)) {
        const input = setError(name, message);
        const details = input && input.closest("details");
        if (details) details.open = true;
        if (input) input.focus();
        return;
      }
    }
    formError.hidden = false;
    formError.textContent = param ? `${param}: ${message}` : message;
    formError.focus();
  }

  // -- submit ---------------------------------------------------------------------------------
  const submit = el("button", { type: "submit", class: "primary" }, "Start training");
  const form = el("form", { class: "card new-job", novalidate: true },
    el("h1", {}, "New training job"),
    formError,
    el("fieldset", {},
      el("legend", {}, "Data"),
      el("div", { class: "field" }, el("label", { for: "upload" }, "Upload a training file (UTF-8 text or JSONL)"),
        fileInput, uploadBox),
      el("div", { class: "field" }, el("label", { for: "training_file" }, "Training file", el("span", { class: "param-name" }, "training_file")),
        fileSelect, errorSlot("training_file")),
      el("div", { class: "field" }, el("label", { for: "validation_file" }, "Validation file",
        el("span", { class: "param-name" }, "validation_file")), valSelect, errorSlot("validation_file"))),
    el("fieldset", { class: "grid" },
      el("legend", {}, "Model"),
      el("div", { class: "field" }, el("label", { for: "model" }, "Preset", el("span", { class: "param-name" }, "model")),
        presetSelect, errorSlot("model")),
      el("div", { class: "field" }, el("label", { for: "suffix" }, "Model name suffix",
        el("span", { class: "param-name" }, "suffix")), suffix, errorSlot("suffix"))),
    archSet, trainSet, advanced,
    el("div", { class: "actions" }, submit, el("a", { href: "#/jobs", class: "button secondary" }, "Cancel")));
  formError.tabIndex = -1;

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors();
    const body = { model: presetSelect.value, training_file: fileSelect.value };
    if (!body.training_file) {
      showFieldError("training_file", "Upload a file or choose one you uploaded before.");
      return;
    }
    if (valSelect.value) body.validation_file = valSelect.value;
    if (suffix.value.trim()) body.suffix = suffix.value.trim();
    const hyperparameters = {};
    for (const f of FIELDS) {
      const value = parseValue(f);
      const d = defaultFor(f);
      if (value === null || value === (d ?? null)) continue; // unchanged: the server's default applies
      if (f.top) body[f.name] = value; else hyperparameters[f.name] = value;
    }
    if (Object.keys(hyperparameters).length) body.hyperparameters = hyperparameters;
    submit.disabled = true;
    submit.textContent = "Starting…";
    try {
      const job = await api("/fine_tuning/jobs", { method: "POST", body });
      toast(`Job ${job.id} created`);
      location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
    } catch (e) {
      if (e instanceof ApiError && e.status !== 401) showFieldError(e.param, e.message);
      else if (!(e instanceof ApiError)) showFieldError(null, e.message);
    } finally {
      submit.disabled = false;
      submit.textContent = "Start training";
    }
  });

  root.append(form);
  loadFiles();
  return { destroy() { abort.abort(); } };
}
