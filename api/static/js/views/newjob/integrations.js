// The job's integrations: send its metrics to Weights & Biases and/or MLflow while it trains. Sent
// as the request's top-level `integrations` list in OpenAI's shape ({"type": "wandb", "wandb":
// {...}}, and likewise "mlflow"); only the services ticked, only the fields filled in (the server
// says what is missing). An error naming `integrations[i].<type>.<field>` is shown at that field.

import { el } from "../../util.js";

const SERVICES = [
  { type: "wandb", title: "Weights & Biases", fields: [
    { name: "project", label: "Project", hint: "required" },
    { name: "name", label: "Run name", hint: "optional" },
    { name: "entity", label: "Entity", hint: "team or user (optional)" },
    { name: "tags", label: "Tags", hint: "comma-separated", list: true },
  ] },
  { type: "mlflow", title: "MLflow", fields: [
    { name: "tracking_uri", label: "Tracking URI", hint: "e.g. http://mlflow:5000" },
    { name: "experiment", label: "Experiment", hint: "optional" },
    { name: "run_name", label: "Run name", hint: "optional" },
  ] },
];

const slotName = (type, field) => `integrations.${type}.${field}`;

/** One service's fieldset: its fields, enabled by ticking the service in the legend. */
function serviceFieldset(service, errors) {
  const on = el("input", { type: "checkbox", id: `int-${service.type}` });
  const inputs = new Map();
  const fields = service.fields.map((f) => {
    const name = slotName(service.type, f.name);
    const input = el("input", { type: "text", id: `int-${service.type}-${f.name}`, name, placeholder: f.hint,
      autocomplete: "off", spellcheck: "false", "aria-describedby": `err-${name}` });
    inputs.set(f.name, input);
    return el("div", { class: "field", dataset: { integration: service.type, param: f.name } },
      el("label", { for: input.id }, f.label, el("span", { class: "param-name" }, f.name)),
      input, errors.slot(name, input));
  });
  const set = el("fieldset", { class: "grid integration", id: `int-${service.type}-fields`, disabled: true },
    el("legend", {}, el("label", { class: "toggle", for: on.id }, on, ` ${service.title}`)), fields);
  on.addEventListener("change", () => {
    set.disabled = !on.checked;
    if (on.checked) inputs.values().next().value.focus();
  });
  return { service, on, inputs, node: set };
}

/** A ticked service's settings: the fields filled in (a list field split at commas). */
function serviceSettings({ service, inputs }) {
  const settings = {};
  for (const f of service.fields) {
    const text = inputs.get(f.name).value.trim();
    if (!text) continue;
    if (f.list) {
      const items = text.split(",").map((t) => t.trim()).filter(Boolean);
      if (items.length) settings[f.name] = items;
    } else settings[f.name] = text;
  }
  return settings;
}

/** errors: FieldErrors. */
export function integrationsSection({ errors }) {
  const summary = el("summary", {}, "Integrations (Weights & Biases, MLflow)");
  const services = SERVICES.map((service) => serviceFieldset(service, errors));
  const node = el("details", { class: "advanced", id: "integrations" }, summary,
    el("p", { class: "help" }, "Log the job's metrics to these services as it trains."),
    services.map((s) => s.node), errors.slot("integrations", summary));

  let sent = []; // the types in the order last sent, to place an error naming integrations[i]

  return {
    node,
    /** The `integrations` list for the request, or null when none is ticked. */
    body() {
      const out = services.filter((s) => s.on.checked)
        .map((s) => ({ type: s.service.type, [s.service.type]: serviceSettings(s) }));
      sent = out.map((i) => i.type);
      return out.length ? out : null;
    },
    /** The error slot for an API error's param (`integrations[0].wandb.project`, `integrations.1.mlflow`,
     *  `integrations`), or null when the param is not about integrations. */
    slotFor(param) {
      const m = /^integrations(?:\[(\d+)\]|\.(\d+))?(?:\.(\w+))?(?:\.(\w+))?/.exec(String(param || ""));
      if (!m) return null;
      const index = m[1] ?? m[2];
      const type = index !== undefined ? sent[Number(index)] : m[3];
      const field = index !== undefined ? m[4] : null;
      const known = type && field && SERVICES.some((s) => s.type === type && s.fields.some((f) => f.name === field));
      return known ? slotName(type, field) : "integrations";
    },
  };
}
