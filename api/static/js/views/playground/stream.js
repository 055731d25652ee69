// One streamed completion in OpenAI's shapes: `data: {json}` events, chat.completion.chunk objects
// (choices[0].delta.content) or text_completion chunks (choices[0].text), a usage-only chunk
// (choices: []) when stream_options.include_usage is set, and a final `data: [DONE]`.

import { ApiError, postEventStream } from "../../api.js";

/** The text one chunk adds: a chat delta's content or a completion's text. */
export function chunkText(chunk) {
  const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : null;
  if (!choice) return "";
  if (choice.delta) return typeof choice.delta.content === "string" ? choice.delta.content : "";
  return typeof choice.text === "string" ? choice.text : "";
}

/**
 * POST /v1<path> with `body` (stream: true) and call onText(text) for every piece of text as it
 * arrives. Resolves to {usage, finishReason, chunks} once [DONE] came; rejects with an ApiError for
 * an error answer (before or inside the stream) or a stream cut short, an AbortError when `signal`
 * aborts (the Stop button).
 */
export async function streamCompletion(path, body, { signal, onText }) {
  const result = { usage: null, finishReason: null, chunks: 0 };
  let done = false;
  await postEventStream(path, body, {
    signal,
    onEvent(ev) {
      if (done || !ev.data) return;
      if (ev.data.trim() === "[DONE]") { done = true; return; }
      let chunk;
      try { chunk = JSON.parse(ev.data); } catch {
        throw new ApiError(200, { message: `the server sent an unreadable event: ${ev.data.slice(0, 80)}` });
      }
      // an error after the stream started comes as an event of its own, in the error envelope
      if (chunk && typeof chunk.error === "object" && chunk.error) throw new ApiError(200, chunk.error);
      if (chunk.usage) result.usage = chunk.usage;
      const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : null;
      if (choice && choice.finish_reason) result.finishReason = choice.finish_reason;
      const text = chunkText(chunk);
      if (text) { result.chunks += 1; onText(text); }
    },
  });
  if (!done) throw new ApiError(200, { message: "the stream ended before the server said it was done" });
  return result;
}

/**
 * One run as the playground and the job page's generate card make it: `body` streamed to /v1<path>
 * with the usage asked for, each piece of text into sink.append and counted by stats (runStats),
 * then sink.end(outcome) and stats.finish. Resolves to {outcome: "done" | "stopped" | "error", error}.
 */
export async function streamRun(path, body, { signal, sink, stats }) {
  stats.start();
  try {
    const result = await streamCompletion(path, { ...body, stream: true, stream_options: { include_usage: true } }, {
      signal,
      onText(text) { sink.append(text); stats.chunk(); },
    });
    sink.end("done");
    stats.finish("done", result);
    return { outcome: "done", error: null };
  } catch (e) {
    const outcome = e.name === "AbortError" ? "stopped" : "error";
    sink.end(outcome);
    stats.finish(outcome);
    return { outcome, error: outcome === "error" ? e : null };
  }
}
