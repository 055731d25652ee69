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
  const text = el("span", { class: "small", role: "status", id: "dl-status" });
  const progress = el("div", { class: "upload-progress", id: "dl-progress", hidden: true }, bar, text);
  const node = el("section", { class: "card", "aria-labelledby": "dl-h" },
    el("h2", { id: "dl-h" }, "Download"),
    el("div", { class: "field" }, el("label", { for: "dl-model" }, "Model or checkpoint"), model),
    el("div", { class: "actions wrap" }, buttons), progress,
    el("p", { class: "help" }, "A format the job did not export as it finished is prepared by a worker on its first download (the button waits for it)."));

  let available = 0; // how many models the picker offers
  const enable = () => { for (const b of buttons) b.disabled = !available; };

  async function download(fmt) {
    if (!model.value) return;
    for (const b of buttons) b.disabled = true;
    progress.hidden = false;
    progress.classList.remove("done");
    setProgress(bar, 0, 1);
    text.textContent = `Requesting ${fmt}…`;
    try {
      const { name, size } = await downloadModel(model.value, fmt, {
        signal,
        onPreparing: (seconds) => { // a worker is making the export (202): the wait, then the file
          progress.dataset.state = "preparing";
          text.textContent = `Preparing ${fmt}… ${seconds}s`;
        },
        onProgress: (got, total) => {
          progress.dataset.state = "downloading";
          setProgress(bar, got, total || got);
          text.textContent = `Downloading ${fmt}: ${fmtBytes(got)}${total ? ` of ${fmtBytes(total)}` : ""}`;
        },
      });
      setProgress(bar, 1, 1);
      progress.dataset.state = "done";
      progress.classList.add("done");
      text.textContent = `Saved ${name} (${fmtBytes(size)})`;
    } catch (e) {
      if (e.name === "AbortError") return;
      progress.dataset.state = "failed";
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
