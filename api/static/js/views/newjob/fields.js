// The hyperparameter fields, rendered from the served schema: architecture (following the chosen
// preset unless edited), training, and the advanced ones folded away. Each shows the value a job
// gets when it is left alone; only the fields changed from that value are sent.

import { el } from "../../util.js";
import { defaultPreset, defaultValue, schemaFields } from "./schema.js";

export const fieldId = (name) => `hp-${name}`;

/** What an empty box shows: the null-means text up to its reason ("auto: 20 evaluations ..." shows
 *  "auto"), so it fits the box; the whole text is the note under it (fieldNode). */
const shortNullMeans = (text) => (text ? text.split(": ")[0] : "default");

/** The control of one field: a select (choice, or a bool left unset by default: unset/on/off), a
 *  checkbox (bool), a group of checkboxes (list: a set of choices) or a text box (numbers, "auto"). */
function control(f) {
  const attrs = { id: fieldId(f.name), name: f.name, "aria-describedby": `help-${f.name} err-${f.name}` };
  if (f.kind === "list") {
    return el("div", { id: attrs.id, class: "choices", role: "group", tabindex: -1,
      "aria-labelledby": `label-${f.name}`, "aria-describedby": attrs["aria-describedby"] },
    f.choices.map((c) => el("label", { class: "choice" },
      el("input", { type: "checkbox", id: `${attrs.id}-${c}`, name: f.name, value: c }), c)));
  }
  const nullMeans = f.nullMeans || "default"; // the whole text: data-null-means (tests read it)
  if (f.tristate) {
    return el("select", { ...attrs, dataset: { nullMeans } }, el("option", { value: "" }, shortNullMeans(f.nullMeans)),
      el("option", { value: "true" }, "on"), el("option", { value: "false" }, "off"));
  }
  if (f.kind === "choice") {
    const empty = f.default === null ? el("option", { value: "" }, shortNullMeans(f.nullMeans)) : null;
    return el("select", { ...attrs, dataset: { nullMeans } }, empty, f.choices.map((c) => el("option", { value: c }, c)));
  }
  if (f.kind === "bool") return el("input", { ...attrs, type: "checkbox" });
  return el("input", { ...attrs, type: "text", inputmode: f.kind === "int" ? "numeric" : "decimal",
    autocomplete: "off", spellcheck: "false" });
}

/** The typed value of a control: null when left empty (the default applies). */
function parse(f, input) {
  if (f.kind === "list") return [...input.querySelectorAll("input:checked")].map((box) => box.value);
  if (f.tristate) return input.value === "" ? null : input.value === "true";
  if (f.kind === "bool") return input.checked;
  if (f.kind === "choice") return input.value === "" ? null : input.value;
  const text = input.value.trim();
  if (text === "") return null;
  if (text === "auto" && f.acceptsAuto) return "auto";
  const n = Number(text);
  return Number.isFinite(n) ? n : text; // the API names what is wrong with a non-number
}

const shown = (value) => (value === null || value === undefined ? "" : String(value));


/** Two values of a field are the same; lists are sets (the order of their choices does not matter). */
const same = (a, b) => (Array.isArray(a) && Array.isArray(b)
  ? a.length === b.length && a.every((x) => b.includes(x))
  : a === b);

/** A field: its label, its control, its help (a tooltip and the control's description) and its
 *  error slot. */
function fieldNode(f, input, errors) {
  // the help text as a tooltip and as the control's description; a long placeholder may be cut off
  const text = [f.help, f.nullMeans && `Left empty: ${f.nullMeans}.`].filter(Boolean).join("\n");
  const help = el("span", { id: `help-${f.name}`, hidden: true }, text);
  const check = f.kind === "bool" && !f.tristate;
  const wrap = el("div", { class: check ? "field field-check" : "field", title: text || null,
    dataset: { field: f.name, kind: f.kind } });
  if (check) wrap.append(input, el("label", { for: input.id }, f.label));
  else if (f.kind === "list") {
    wrap.append(el("span", { class: "label", id: `label-${f.name}` }, f.label,
      el("span", { class: "param-name" }, f.name)), input);
  } else wrap.append(el("label", { for: input.id }, f.label, el("span", { class: "param-name" }, f.name)), input);
  if (f.nullMeans && shortNullMeans(f.nullMeans) !== f.nullMeans && f.kind !== "list" && (f.kind !== "bool" || f.tristate)) {
    wrap.append(el("p", { class: "help null-means", id: `null-${f.name}` }, `Empty: ${f.nullMeans}`));
  }
  wrap.append(help, errors.slot(f.name, input));
  return wrap;
}

/** Show the value v in the field's control (null: empty). */
function showValue(f, input, v) {
  if (f.kind === "bool" && !f.tristate) input.checked = !!v;
  else if (f.kind === "list") {
    for (const box of input.querySelectorAll("input")) box.checked = (v || []).includes(box.value);
  } else input.value = shown(v);
}

/** Show the default d in the field's control; an empty default shows what it means. */
function showDefault(f, input, d) {
  showValue(f, input, d);
  if (!f.tristate && !["bool", "list", "choice"].includes(f.kind)) {
    const empty = d === null || d === undefined;
    input.placeholder = empty ? shortNullMeans(f.nullMeans) : "";
    input.dataset.nullMeans = empty ? f.nullMeans || "default" : ""; // the whole text (tests read it)
  }
  input.dataset.default = shown(d);
}

/** schema: the served JSON Schema; errors: FieldErrors. */
export function hyperparameterFields({ schema, errors }) {
  const fields = schemaFields(schema);
  const inputs = new Map(); // name -> control
  let preset = defaultPreset(schema);
  const defaultOf = (f) => defaultValue(schema, f, preset);
  const showPresetDefault = (f) => showDefault(f, inputs.get(f.name), defaultOf(f));

  const untouched = (f) => {
    const input = inputs.get(f.name);
    if (f.kind === "list") return same(parse(f, input), defaultOf(f) || []);
    if (f.kind === "bool" && !f.tristate) return input.checked === (input.dataset.default === "true");
    return input.value === input.dataset.default;
  };

  const nodes = (pick) => fields.filter(pick).map((f) => {
    const input = control(f);
    inputs.set(f.name, input);
    return fieldNode(f, input, errors);
  });
  const architecture = el("fieldset", { class: "grid", id: "hp-architecture" },
    el("legend", {}, "Architecture (from the preset)"), nodes((f) => f.architecture && !f.advanced));
  const training = el("fieldset", { class: "grid", id: "hp-training" },
    el("legend", {}, "Training"), nodes((f) => !f.architecture && !f.advanced));
  const advanced = el("details", { class: "advanced", id: "hp-advanced" },
    el("summary", {}, "Advanced hyperparameters"), el("div", { class: "grid" }, nodes((f) => f.advanced)));
  fields.forEach(showPresetDefault);

  return {
    architecture,
    training,
    advanced,
    /** The architecture follows the preset, except the fields the user has edited. */
    setPreset(name) {
      const follow = fields.filter((f) => f.architecture && untouched(f));
      preset = name;
      follow.forEach(showPresetDefault);
    },
    /** Show these values ({name: value}: the hyperparameters of a job being cloned) in their
     *  fields; a name the form has no field for is left out. */
    prefill(values) {
      for (const f of fields) if (f.name in values) showValue(f, inputs.get(f.name), values[f.name]);
    },
    /** {name: value} of the fields whose value differs from the default a job would get. */
    changed() {
      const out = {};
      for (const f of fields) {
        const value = parse(f, inputs.get(f.name));
        if (value === null || same(value, defaultOf(f) ?? null)) continue;
        out[f.name] = value;
      }
      return out;
    },
  };
}
