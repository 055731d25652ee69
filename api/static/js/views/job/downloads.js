// The "Download" card: one button per download format the API serves (served.js), with progress
// while the file arrives.

import { downloadModel } from "../../api.js";
import { loadExportFormats } from "../../served.js";
import { clear, el, fmtBytes, progressBar, setProgress } from "../../util.js";
import { fillModelSelect, modelSelect } from "./models.js";

/**
 * Fill `row` with one disabled button per served format; a click calls onClick(format, extension).
 * Resolves to the buttons (none when the formats could not be read: `row` says why).
 */
async function formatButtons(row, onClick) {
  let served;
  try {
    served = await loadExportFormats();
  } catch (e) {
    clear(row, el("span", { class: "small", role: "alert" }, `Could not read the download formats: ${e.message}`));
    return [];
  }
  const buttons = served.formats.map((f) => el("button", {
    type: "button", class: "secondary", id: `dl-${f.name}`, disabled: true, title: f.description,
    onclick: () => onClick(f.name, f.extension),
  }, f.title));
  clear(row, buttons);
  return buttons;
}

export function downloadCard({ signal }) {
  const model = modelSelect("dl-model");
  let buttons = []; // filled once the served formats arrive
  const row = el("div", { class: "actions wrap" });
  const bar = progressBar(0, 1, "Download progress");
  const text = el("span", { class: "small", role: "status", id: "dl-status" });
  const progress = el("div", { class: "upload-progress", id: "dl-progress", hidden: true }, bar, text);
  const node = el("section", { class: "card", "aria-labelledby": "dl-h" },
    el("h2", { id: "dl-h" }, "Download"),
    el("div", { class: "field" }, el("label", { for: "dl-model" }, "Model or checkpoint"), model),
    row, progress,
    el("p", { class: "help" }, "A format the job did not export as it finished is prepared by a worker on its first download (the button waits for it)."));

  let available = 0; // how many models the picker offers
  const enable = () => { for (const b of buttons) b.disabled = !available; };

  async function download(fmt, extension) {
    if (!model.value) return;
    for (const b of buttons) b.disabled = true;
    progress.hidden = false;
    progress.classList.remove("done");
    setProgress(bar, 0, 1);
    text.textContent = `Requesting ${fmt}…`;
    try {
      const { name, size } = await downloadModel(model.value, fmt, {
        signal,
        extension,
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
  formatButtons(row, download).then((made) => { buttons = made; enable(); });

  return {
    node,
    setModels(models) {
      available = models.length;
      fillModelSelect(model, models);
      enable();
    },
  };
}
