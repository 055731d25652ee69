// Sign in: the API key is checked against the API (GET /v1/fine_tuning/jobs?limit=1) and kept in
// sessionStorage (this tab), or also in localStorage when "Remember on this device" is ticked. A
// refused key leaves nothing stored and says why. Signed in, the user lands on the address they
// opened (a deep link), not always on the jobs list.

import { api, ApiError, clearKey, setKey } from "../api.js";
import { el } from "../util.js";

/** Where to go once signed in: the address the user opened (a deep link such as #/jobs/ftjob-…
 *  stays in the address while the sign-in shows), or the jobs list. */
function requestedRoute() {
  const hash = location.hash;
  return hash && hash !== "#" && !/^#\/?signin(?:[/?]|$)/.test(hash) ? hash : "#/jobs";
}

export function mountSignIn(root, { notice } = {}) {
  const input = el("input", {
    id: "api-key", name: "api-key", type: "password", autocomplete: "current-password", required: true,
    spellcheck: "false", placeholder: "fsk-…", "aria-describedby": "api-key-help api-key-error",
  });
  const remember = el("input", { id: "remember-key", name: "remember-key", type: "checkbox" });
  const error = el("p", { id: "api-key-error", class: "field-error", role: "alert" });
  const button = el("button", { type: "submit", class: "primary" }, "Sign in");
  const form = el("form", { class: "card signin", novalidate: true },
    el("h1", {}, "Sign in"),
    notice ? el("p", { class: "notice", role: "status" }, notice) : null,
    el("label", { for: "api-key" }, "API key"),
    input,
    el("p", { id: "api-key-help", class: "help" },
      "The key printed by ", el("code", {}, "fromscratch serve"), ", or make one with ",
      el("code", {}, "fromscratch keys create --name NAME"), ". It is kept in this tab only, until it closes."),
    el("div", { class: "field-check" }, remember, el("label", { for: "remember-key" }, "Remember on this device")),
    el("p", { class: "help" }, "Keeps the key in this browser until you sign out: only on a device no one else uses."),
    error,
    button);

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const key = input.value.trim();
    error.textContent = "";
    if (!key) {
      error.textContent = "Enter an API key.";
      input.focus();
      return;
    }
    button.disabled = true;
    button.textContent = "Checking…";
    setKey(key, { remember: remember.checked });
    try {
      await api("/fine_tuning/jobs?limit=1", { notify401: false });
      const target = requestedRoute();
      if (location.hash === target) window.dispatchEvent(new HashChangeEvent("hashchange"));
      else location.hash = target;
    } catch (e) {
      clearKey();
      if (e instanceof ApiError && e.status === 401) {
        error.textContent = "This API key was not accepted (401 Unauthorized). Check it for typos, or create a new one.";
      } else {
        error.textContent = `Could not sign in: ${e.message}`;
      }
      input.setAttribute("aria-invalid", "true");
      input.focus();
    } finally {
      button.disabled = false;
      button.textContent = "Sign in";
    }
  });

  root.append(form);
  input.focus();
  return { destroy() {} };
}
