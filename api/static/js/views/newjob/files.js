// The form's data: upload a training file (with a progress bar), or pick an uploaded one; an
// optional validation file. Only `purpose=fine-tune` files are offered: a job's result CSVs
// (fine-tune-results) are files too, but a job cannot train on them. The lists are read again each
// time the page is shown again (a file deleted elsewhere leaves them).

import { api, query, uploadFile } from "../../api.js";
import { clear, el, fmtBytes, fmtTime, onShownAgain, progressBar, setProgress } from "../../util.js";

const ACCEPT = ".txt,.jsonl,.json,.md,text/plain,application/jsonl";
const TRAINABLE = "fine-tune"; // the one purpose a job's training and validation files may have

const labelled = (id, text, name) => el("label", { for: id }, text, el("span", { class: "param-name" }, name));

/** errors: FieldErrors; signal aborts uploads and listings when the page goes away; onLoaded()
 *  after each listing (the selects may have changed). */
export function dataFieldset({ errors, signal, onLoaded = () => {} }) {
  const parts = dataNodes(errors);
  const listing = fileLister(parts, { errors, signal });
  const load = async (choose) => { await listing(choose); onLoaded(); };
  parts.upload.addEventListener("change", () => uploadChosenFile(parts, { errors, signal, load }));
  onShownAgain(() => load(), signal);
  return {
    node: parts.node,
    load,
    trainingFile: () => parts.trainingFile.value,
    validationFile: () => parts.validationFile.value,
  };
}

/** The fieldset: the upload box with its progress, and the two file selects. */
function dataNodes(errors) {
  const trainingFile = el("select", { id: "training_file", name: "training_file", "aria-describedby": "err-training_file" },
    el("option", { value: "" }, "— choose an uploaded file —"));
  const validationFile = el("select", { id: "validation_file", name: "validation_file", "aria-describedby": "err-validation_file" },
    el("option", { value: "" }, "none (hold out the end of the training file)"));
  const upload = el("input", { id: "upload", type: "file", accept: ACCEPT });
  const bar = progressBar(0, 1, "Upload progress");
  const text = el("span", { class: "small", role: "status" }, "");
  const progress = el("div", { class: "upload-progress", hidden: true }, bar, text);
  const node = el("fieldset", {},
    el("legend", {}, "Data"),
    el("div", { class: "field" }, el("label", { for: "upload" }, "Upload a training file (UTF-8 text or JSONL)"),
      upload, progress),
    el("div", { class: "field" }, labelled("training_file", "Training file", "training_file"),
      trainingFile, errors.slot("training_file", trainingFile)),
    el("div", { class: "field" }, labelled("validation_file", "Validation file", "validation_file"),
      validationFile, errors.slot("validation_file", validationFile)));
  return { node, trainingFile, validationFile, upload, bar, text, progress };
}

/** load(choose): fill both selects with the uploaded files, newest first, each keeping what it
 *  shows unless `choose` ({training_file, validation_file}: file ids) names another. A file chosen
 *  that the list lacks (deleted since) is said under its select, which goes back to empty.
 *  Listings can overlap (the one on mount, the one after an upload): only the newest one asked for
 *  is applied, so a slow older answer never puts back a list without the new file. */
function fileLister({ trainingFile, validationFile }, { errors, signal }) {
  let listing = 0;
  return async function load(choose = {}) {
    const mine = ++listing;
    try {
      const page = await api(`/files${query({ purpose: TRAINABLE })}`, { signal });
      if (mine !== listing) return;
      const files = (page.data || []).slice().sort((a, b) => (b.created_at || 0) - (a.created_at || 0));
      for (const sel of [trainingFile, validationFile]) {
        const wanted = choose[sel.name] ?? sel.value;
        clear(sel, sel.firstChild);
        for (const f of files) {
          sel.append(el("option", { value: f.id },
            `${f.filename || f.id} · ${fmtBytes(f.bytes)} · ${fmtTime(f.created_at)} (${f.id})`));
        }
        sel.value = wanted;
        if (wanted && sel.value !== wanted) {
          errors.set(sel.name, `${wanted} is no longer among your files (deleted): choose another or upload it again.`);
        }
      }
    } catch (e) {
      if (e.name !== "AbortError") errors.show("training_file", `Could not list files: ${e.message}`);
    }
  };
}

/** Upload the file chosen in the upload box, showing its progress, then select it. */
async function uploadChosenFile({ upload, trainingFile, bar, text, progress }, { errors, signal, load }) {
  const file = upload.files && upload.files[0];
  if (!file) return;
  errors.set("training_file", "");
  progress.hidden = false;
  progress.classList.remove("done");
  setProgress(bar, 0, file.size);
  text.textContent = `Uploading ${file.name}: 0 of ${fmtBytes(file.size)}`;
  try {
    const obj = await uploadFile(file, {
      signal,
      onProgress: (loaded, total) => {
        setProgress(bar, loaded, total);
        text.textContent = `Uploading ${file.name}: ${fmtBytes(loaded)} of ${fmtBytes(total)}`;
      },
    });
    setProgress(bar, 1, 1);
    await load({ training_file: obj.id });
    if (![...trainingFile.options].some((o) => o.value === obj.id)) {  // the listing failed
      trainingFile.append(el("option", { value: obj.id }, `${obj.filename || file.name} (${obj.id})`));
      errors.set("training_file", "");
    }
    trainingFile.value = obj.id;
    // said once the file is selected: "Uploaded" means the form is ready to start with it
    progress.classList.add("done");
    text.textContent = `Uploaded ${obj.filename || file.name} (${fmtBytes(obj.bytes)}) as ${obj.id}`;
  } catch (e) {
    if (e.name === "AbortError") return;
    text.textContent = "Upload failed.";
    errors.show("training_file", e.message);
  } finally {
    upload.value = "";
  }
}
