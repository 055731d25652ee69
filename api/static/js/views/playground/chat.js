// Chat mode: a system prompt, the conversation so far, and the next user message. A turn is sent
// as the whole conversation (POST /v1/chat/completions, messages); the assistant's answer is
// appended to the conversation as it streams in.

import { el } from "../../util.js";

const ROLE_LABEL = { user: "You", assistant: "Assistant" };

function messageNode(role, text = "") {
  const body = el("div", { class: "msg-text" }, text);
  const node = el("li", { class: `msg msg-${role}`, dataset: { role } },
    el("span", { class: "msg-role" }, ROLE_LABEL[role]), body);
  return { node, body };
}

/** onSubmit(): what Enter in the message box does (the page's run). */
export function chatPane({ onSubmit }) {
  const parts = chatNodes();
  const { system, log, input, empty } = parts;
  const history = []; // [{role, content}] of the finished turns
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); onSubmit(); }
  });

  return {
    node: parts.node,
    path: "/chat/completions",
    submitLabel: "Send",
    /** The request's messages, or null (and the message box focused) when there is nothing to send. */
    request() {
      const text = input.value;
      if (!text.trim()) { input.focus(); return null; }
      const messages = system.value.trim() ? [{ role: "system", content: system.value }] : [];
      return { messages: [...messages, ...history, { role: "user", content: text }] };
    },
    begin: () => beginTurn(parts, history),
    clear() {
      history.length = 0;
      log.replaceChildren(empty);
    },
    focus() { input.focus(); },
  };
}

/** The system prompt, the conversation (with its "no messages" line) and the message box. */
function chatNodes() {
  const system = el("textarea", { id: "pg-system", name: "system", rows: 2,
    placeholder: "Optional: how the assistant should behave" });
  const empty = el("li", { class: "muted msg-empty" }, "No messages yet.");
  const log = el("ol", { class: "chat-log", id: "pg-chat-log", "aria-label": "Conversation", "aria-live": "polite" },
    empty);
  const input = el("textarea", { id: "pg-message", name: "message", rows: 3, placeholder: "Say something…",
    "aria-describedby": "pg-message-help" });
  const node = el("div", { class: "pg-pane", dataset: { mode: "chat" } },
    el("div", { class: "field" }, el("label", { for: "pg-system" }, "System prompt"), system),
    log,
    el("div", { class: "field" }, el("label", { for: "pg-message" }, "Your message"), input,
      el("p", { class: "help", id: "pg-message-help" }, "Enter sends, Shift+Enter starts a new line.")));
  return { node, system, empty, log, input };
}

/** The turn starts: the user's message and an empty answer join the conversation. The answer's
 *  sink: append(piece) as it streams in, end(outcome) once it stops; a finished turn joins history. */
function beginTurn({ log, empty, input }, history) {
  const text = input.value;
  const user = messageNode("user", text);
  const answer = messageNode("assistant");
  answer.node.classList.add("streaming");
  log.setAttribute("aria-busy", "true"); // screen readers read the answer once, when it is complete
  empty.remove();
  log.append(user.node, answer.node);
  input.value = "";
  let received = "";
  const scroll = () => { log.scrollTop = log.scrollHeight; };
  scroll();
  return {
    append(piece) { received += piece; answer.body.append(piece); scroll(); },
    /** outcome: done | stopped | error. A turn that failed before any answer is taken back. */
    end(outcome) {
      answer.node.classList.remove("streaming");
      log.removeAttribute("aria-busy");
      answer.body.normalize(); // one text node, not one per chunk
      if (outcome === "error" && !received) {
        user.node.remove();
        answer.node.remove();
        if (!log.querySelector(".msg")) log.append(empty);
        input.value = text;
        return;
      }
      if (outcome !== "done") {
        answer.node.dataset.outcome = outcome;
        answer.node.append(el("span", { class: "msg-note" }, outcome === "stopped" ? "stopped" : "cut short"));
      }
      history.push({ role: "user", content: text }, { role: "assistant", content: received });
    },
  };
}
