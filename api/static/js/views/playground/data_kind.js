// Which mode a model is tried in first: chat for a model trained on conversations (JSONL records
// with "messages"), completion for one trained on anything else (plain text, {"text"} or
// prompt/completion records). The API says which file trained a model (its job's training_file)
// but not what its records are, so the page reads the start of that file (a Range request) and
// looks at its first record, as the trainer's format detection does (trainer/data/formats.py).

import { api, fileStart } from "../../api.js";

const READ_BYTES = 64 * 1024; // enough for a first record; a longer one is judged by how it starts

/** "chat" when the first non-blank line of a file's start is a record with "messages", else "text". */
export function dataKind(start) {
  const line = start.replace(/^\uFEFF/, "").split(/\r?\n/).find((l) => l.trim()) || "";
  try {
    const record = JSON.parse(line);
    return record && typeof record === "object" && Array.isArray(record.messages) ? "chat" : "text";
  } catch {
    return /^\s*\{\s*"messages"\s*:\s*\[/.test(line) ? "chat" : "text"; // cut short, or not JSON
  }
}

/** "chat" | "text" for a model ({id, job_id, ...} as GET /v1/models lists it): "text" when it cannot
 *  be told (no job, or its training file deleted since). */
export async function modelDataKind(model, signal) {
  if (!model || !model.job_id) return "text";
  try {
    const job = await api(`/fine_tuning/jobs/${encodeURIComponent(model.job_id)}`, { signal });
    return dataKind(await fileStart(job.training_file, READ_BYTES, { signal }));
  } catch (e) {
    if (e.name === "AbortError") throw e;
    return "text";
  }
}
