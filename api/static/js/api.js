// The public /v1 API from the browser: fetch with the Bearer key, the {"error": {...}} envelope as
// ApiError, uploads through XMLHttpRequest (for upload progress), Server-Sent Events read with
// fetch() (EventSource can neither send an Authorization header nor POST): the job's stream and the
// streamed completions, and model downloads.

import { sleep } from "./util.js";

const KEY_STORAGE = "fromscratch.apiKey";

export class ApiError extends Error {
  constructor(status, err = {}) {
    super(err.message || `request failed (HTTP ${status})`);
    this.name = "ApiError";
    this.status = status;
    this.type = err.type || null;
    this.param = err.param || null;
    this.code = err.code || null;
  }
}

// The key lives in sessionStorage (this tab, until it closes) unless the user ticked "Remember on
// this device" at sign-in: then in localStorage too, until they sign out.
export function getKey() {
  try { return sessionStorage.getItem(KEY_STORAGE) || localStorage.getItem(KEY_STORAGE) || ""; } catch { return ""; }
}
export function setKey(key, { remember = false } = {}) {
  sessionStorage.setItem(KEY_STORAGE, key);
  if (remember) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
}
export function clearKey() {
  sessionStorage.removeItem(KEY_STORAGE);
  localStorage.removeItem(KEY_STORAGE);
}

let unauthorizedHandler = () => {};
/** Called with the ApiError whenever the server answers 401 (a bad or revoked key). */
export function onUnauthorized(fn) { unauthorizedHandler = fn; }

function authHeaders(extra = {}) {
  const key = getKey();
  return key ? { Authorization: `Bearer ${key}`, ...extra } : { ...extra };
}

async function errorFrom(res, notify = true) {
  let err = {};
  try {
    const body = await res.json();
    if (body && typeof body.error === "object" && body.error) err = body.error;
    else if (body && body.detail) err = { message: String(body.detail) };
  } catch { /* not JSON */ }
  if (!err.message) err.message = `${res.status} ${res.statusText || "error"}`;
  const e = new ApiError(res.status, err);
  if (res.status === 401 && notify) unauthorizedHandler(e);
  return e;
}

/** JSON request to /v1<path>. Throws ApiError (network failures too, with status 0). A 401 also
 *  signs the user out (onUnauthorized) unless `notify401` is false. */
export async function api(path, { method = "GET", body, signal, headers = {}, notify401 = true } = {}) {
  const init = { method, signal, headers: authHeaders(headers) };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let res;
  try {
    res = await fetch(`/v1${path}`, init);
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, { message: "cannot reach the server (network error)" });
  }
  if (!res.ok) throw await errorFrom(res, notify401);
  if (res.status === 204) return null;
  return res.json();
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}

/** Upload a File to POST /v1/files with progress callbacks (loaded, total). Resolves to the file object. */
export function uploadFile(file, { purpose = "fine-tune", onProgress, signal } = {}) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", "/v1/files");
    const key = getKey();
    if (key) xhr.setRequestHeader("Authorization", `Bearer ${key}`);
    xhr.responseType = "text";
    xhr.upload.onprogress = (ev) => { if (onProgress) onProgress(ev.loaded, ev.lengthComputable ? ev.total : file.size); };
    xhr.onload = () => {
      let body = null;
      try { body = JSON.parse(xhr.responseText); } catch { /* not JSON */ }
      if (xhr.status >= 200 && xhr.status < 300 && body) return resolve(body);
      const e = new ApiError(xhr.status, (body && body.error) || { message: `upload failed (HTTP ${xhr.status})` });
      if (xhr.status === 401) unauthorizedHandler(e);
      reject(e);
    };
    xhr.onerror = () => reject(new ApiError(0, { message: "upload failed: cannot reach the server" }));
    xhr.onabort = () => reject(new DOMException("upload aborted", "AbortError"));
    if (signal) signal.addEventListener("abort", () => xhr.abort(), { once: true });
    const form = new FormData();
    form.append("purpose", purpose);
    form.append("file", file, file.name);
    xhr.send(form);
  });
}

/** The first `bytes` bytes of file `fileId`, as text (GET /v1/files/{id}/content with a Range): a
 *  look at the start of a file, however large, without downloading it. */
export async function fileStart(fileId, bytes, { signal } = {}) {
  let res;
  try {
    res = await fetch(`/v1/files/${encodeURIComponent(fileId)}/content`,
      { signal, headers: authHeaders({ Range: `bytes=0-${bytes - 1}` }) });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, { message: "cannot reach the server (network error)" });
  }
  if (!res.ok) throw await errorFrom(res);
  const chunks = [];
  let received = 0;
  const reader = res.body.getReader();
  while (received < bytes) { // a server that ignores the Range sends it all: read no further
    const { value, done } = await reader.read();
    if (done) break;
    chunks.push(value);
    received += value.length;
  }
  reader.cancel().catch(() => {});
  const start = new Uint8Array(await new Blob(chunks).arrayBuffer()).subarray(0, bytes);
  return new TextDecoder().decode(start);
}

/** Incremental text/event-stream parser (the WHATWG rules). feed(text) returns complete events. */
export class SSEParser {
  constructor() { this.buf = ""; this.reset(); this.lastEventId = null; }
  reset() { this.event = ""; this.data = []; this.id = null; }
  feed(text) {
    this.buf += text;
    const out = [];
    for (;;) {
      const m = /\r\n|\n|\r/.exec(this.buf);
      if (!m) break;
      // a lone CR at the very end may be the first half of a CRLF
      if (m[0] === "\r" && m.index === this.buf.length - 1) break;
      const line = this.buf.slice(0, m.index);
      this.buf = this.buf.slice(m.index + m[0].length);
      const ev = this.line(line);
      if (ev) out.push(ev);
    }
    return out;
  }
  line(line) {
    if (line === "") {
      if (!this.data.length && !this.event && this.id === null) return null;
      const ev = { event: this.event || "message", data: this.data.join("\n"), id: this.id };
      if (this.id !== null) this.lastEventId = this.id;
      this.reset();
      return ev;
    }
    if (line.startsWith(":")) return null;
    const i = line.indexOf(":");
    const name = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? "" : line.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "data") this.data.push(value);
    else if (name === "event") this.event = value;
    else if (name === "id" && !value.includes("\0")) this.id = value;
    return null;
  }
}

/** Feed a fetch Response's text/event-stream body through an SSEParser, onEvent(ev) per event. */
async function readEvents(res, onEvent) {
  if (!res.body) throw new ApiError(0, { message: "streaming is not supported by this browser" });
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  const parser = new SSEParser();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      for (const ev of parser.feed(value)) onEvent(ev);
    }
  } catch (e) {
    reader.cancel().catch(() => {}); // onEvent gave up on the stream: close the connection too
    throw e;
  } finally {
    reader.releaseLock();
  }
}

/**
 * Read GET /v1/fine_tuning/jobs/{id}/stream and call onEvent({event, data, id}) for each event.
 * Resolves when the server ends the stream; rejects on errors (ApiError for HTTP errors).
 */
export async function streamJob(jobId, { lastEventId, signal, onEvent }) {
  const headers = authHeaders({ Accept: "text/event-stream" });
  if (lastEventId) headers["Last-Event-ID"] = lastEventId;
  const url = `/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/stream`;
  const res = await fetch(url, { headers, signal, cache: "no-store" });
  if (!res.ok) throw await errorFrom(res);
  await readEvents(res, onEvent);
}

/**
 * POST a JSON body to /v1<path> and read the text/event-stream answer (EventSource cannot POST):
 * onEvent({event, data, id}) per event. A non-2xx answer throws its {"error": {...}} as ApiError
 * before anything is read; aborting `signal` rejects with an AbortError.
 */
export async function postEventStream(path, body, { signal, onEvent }) {
  let res;
  try {
    res = await fetch(`/v1${path}`, {
      method: "POST", signal, cache: "no-store", body: JSON.stringify(body),
      headers: authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, { message: "cannot reach the server (network error)" });
  }
  if (!res.ok) throw await errorFrom(res);
  await readEvents(res, onEvent);
}

/** Parse `filename="x"` out of a Content-Disposition header. */
export function dispositionFilename(header) {
  if (!header) return null;
  const star = /filename\*\s*=\s*UTF-8''([^;]+)/i.exec(header);
  if (star) { try { return decodeURIComponent(star[1].trim()); } catch { /* fall through */ } }
  const m = /filename\s*=\s*"?([^";]+)"?/i.exec(header);
  return m ? m[1].trim() : null;
}

/**
 * Download GET /v1/models/{id}/content?format=fmt with the Bearer header and hand it to the
 * browser as a file (named by the server, else the model id with `extension`). onProgress(received, total|null). An export a worker is still preparing
 * answers 202: ask again after its Retry-After seconds, calling onPreparing(seconds waited), for
 * at most maxWaitMs.
 */
export async function downloadModel(modelId, fmt, { extension = "bin", onProgress, onPreparing, signal, maxWaitMs = 15 * 60_000 } = {}) {
  const path = `/v1/models/${encodeURIComponent(modelId)}/content${query({ format: fmt })}`;
  const started = Date.now();
  let res;
  for (;;) {
    try {
      res = await fetch(path, { headers: authHeaders(), signal });
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError(0, { message: "download failed: cannot reach the server" });
    }
    if (res.status !== 202) break;
    await res.body?.cancel();
    const waited = Date.now() - started;
    if (waited > maxWaitMs) {
      throw new ApiError(202, { message: `the ${fmt} export was still being prepared after ${Math.round(waited / 1000)} s; try again later` });
    }
    if (onPreparing) onPreparing(Math.round(waited / 1000));
    const retry = Math.min(Math.max(Number(res.headers.get("Retry-After")) || 2, 1), 30);
    await sleep(retry * 1000, signal);
    if (signal && signal.aborted) throw new DOMException("download aborted", "AbortError");
  }
  if (!res.ok) throw await errorFrom(res);
  const total = Number(res.headers.get("Content-Length")) || null;
  const name = dispositionFilename(res.headers.get("Content-Disposition"))
    || `${modelId.replace(/[^A-Za-z0-9._-]+/g, "_")}.${extension}`;
  const chunks = [];
  let received = 0;
  const reader = res.body.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    chunks.push(value);
    received += value.length;
    if (onProgress) onProgress(received, total);
  }
  const blob = new Blob(chunks, { type: res.headers.get("Content-Type") || "application/octet-stream" });
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  a.hidden = true;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
  return { name, size: received };
}
