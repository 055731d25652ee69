// Reading the served hyperparameter schema (GET /v1/fine_tuning/hyperparameters, a JSON Schema with
// x- annotations for forms): which fields there are, in what order, their labels, kinds, choices and
// defaults, and the architecture each preset gives. Nothing here names a particular field.

/** One descriptor per property, in the order the schema lists them (the order a form shows them). */
export function schemaFields(schema) {
  return Object.entries(schema.properties || {}).map(([name, p]) => ({
    name,
    label: p.title || name,
    help: p.description || "",
    kind: p["x-kind"], // int | float | bool | choice | list (a set of choices: an array of an enum)
    // a bool whose default is unset (null: decided at run time, e.g. "auto") has three states
    tristate: p["x-kind"] === "bool" && (p.default ?? null) === null,
    choices: p.enum || (p.items && p.items.enum) || [],
    default: p.default ?? null,
    architecture: p["x-section"] === "model", // its default follows the preset
    advanced: !!p["x-advanced"],
    nullMeans: p["x-null-means"] || "", // what leaving it empty means
    acceptsAuto: !!p["x-accepts-auto"], // OpenAI's "auto" (= the default) is accepted
  }));
}

export const presetNames = (schema) => Object.keys(schema["x-presets"] || {});

export const defaultPreset = (schema) => schema["x-default-preset"] ?? presetNames(schema)[0];

/** The value a job gets for `field` when it is left out, with `preset` as the model. */
export function defaultValue(schema, field, preset) {
  const architecture = field.architecture ? (schema["x-presets"] || {})[preset] : null;
  if (architecture && field.name in architecture) return architecture[field.name];
  return field.default;
}
