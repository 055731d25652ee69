// The "Download" card: one button per export format, with progress while the file arrives.

import { downloadModel } from "../../api.js";
import { el, fmtBytes, progressBar, setProgress } from "../../util.js";
import { fillModelSelect, modelSelect } from "./models.js";

const FORMATS = [
  ["gguf", "GGUF (llama.cpp)"],
  ["hf", "Hugging Face"],
  ["onnx", "ONNX"],
  ["checkpoint", "Checkpoint"],
];

export function downloadCard({ signal }) {
  const model = modelSelect("dl-model");
  const buttons = FORMATS.map(([fmt, label]) =>
    el("button", { type: "button", class: "secondary", id: `dl-${fmt}`, disabled: true, dataset: { format: fmt } }, label));
  const bar = progressBar(0, 1, "Download progress");
  const text = el("span", { class: "small", role: "status" });
  const progress = el("div", { class: "upload-progress", hidden: true }, bar, text);
  const node = el("section", { class: "card", "aria-labelledby": "dl-h" },
    el("h2", { id: "dl-h" }, "Download"),
    el("div", { class: "field" }, el("label", { for: "dl-model" }, "Model or checkpoint"), model),
    el("div", { class: "actions wrap" }, buttons), progress,
    el("p", { class: "help" }, "The first download of a format is exported on the server and may take a moment."));

  let available = 0; // how many models the picker offers
  const enable = () => { for (const b of buttons) b.disabled = !available; };

  async function download(fmt) {
    if (!model.value) return;
    for (const b of buttons) b.disabled = true;
    progress.hidden = false;
    progress.classList.remove("done");
    setProgress(bar, 0, 1);
    text.textContent = `Preparing ${fmt}…`;
    try {
      const { name, size } = await downloadModel(model.value, fmt, {
        signal,
        onProgress: (got, total) => {
          setProgress(bar, got, total || got);
          text.textContent = `Downloading ${fmt}: ${fmtBytes(got)}${total ? ` of ${fmtBytes(total)}` : ""}`;
        },
      });
      setProgress(bar, 1, 1);
      progress.classList.add("done");
      text.textContent = `Saved ${name} (${fmtBytes(size)})`;
    } catch (e) {
      if (e.name === "AbortError") return;
      text.textContent = `Download failed: ${e.message}`;
    } finally {
      enable();
    }
  }
  for (const b of buttons) b.addEventListener("click", () => download(b.dataset.format));

  return {
    node,
    setModels(models) {
      available = models.length;
      fillModelSelect(model, models);
      enable();
    },
  };
}
