// The line under a run: while streaming, how much text came; after it, the token usage the server
// reported (stream_options.include_usage), tokens per second and how long the first text took.

import { el, fmtInt } from "../../util.js";

const seconds = (ms) => `${(ms / 1000).toFixed(2)} s`;

export function runStats({ id = "pg-stats" } = {}) {
  const node = el("p", { class: "muted small pg-stats", id, role: "status" });
  let started = 0, first = 0, chunks = 0;

  return {
    node,
    clear() {
      for (const name of ["promptTokens", "completionTokens", "chunks"]) delete node.dataset[name];
      node.textContent = "";
    },
    start() {
      started = performance.now();
      first = 0;
      chunks = 0;
      this.clear();
      node.textContent = "Waiting for the model…";
    },
    chunk() {
      if (!first) first = performance.now();
      chunks += 1;
      node.textContent = `Streaming… ${fmtInt(chunks)} chunk${chunks === 1 ? "" : "s"}`;
    },
    /** The run ended: outcome done | stopped | error; result from streamCompletion when done. */
    finish(outcome, result = null) {
      const elapsed = performance.now() - started;
      const parts = [];
      const usage = result && result.usage;
      node.dataset.chunks = chunks; // the pieces of text the stream brought (the tests read it)
      if (usage) {
        node.dataset.promptTokens = usage.prompt_tokens;
        node.dataset.completionTokens = usage.completion_tokens;
        parts.push(`${fmtInt(usage.prompt_tokens)} prompt + ${fmtInt(usage.completion_tokens)} completion tokens`);
        const rate = elapsed > 0 ? (1000 * usage.completion_tokens) / elapsed : 0;
        parts.push(`${rate.toFixed(1)} tokens/s`);
      } else if (chunks || outcome === "done") {
        parts.push(`${fmtInt(chunks)} chunk${chunks === 1 ? "" : "s"}`);
      }
      parts.push(`${seconds(elapsed)} in all`);
      if (first) parts.push(`first text after ${seconds(first - started)}`);
      if (result && result.finishReason) parts.push(`finish: ${result.finishReason}`);
      if (outcome === "stopped") parts.unshift("Stopped");
      if (outcome === "error") parts.unshift("Failed");
      node.textContent = parts.join(" · ");
    },
  };
}
