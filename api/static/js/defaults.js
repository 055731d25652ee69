// Mirror of trainer/config.py (TrainConfig defaults, ModelConfig defaults, PRESETS), so the new-job
// form shows the values a job gets when a field is left alone. Each object below is strict JSON:
// tests/dashboard/test_defaults_mirror.py parses them and checks they agree with trainer.config.

export const TRAIN_DEFAULTS = {
  "tokenizer": "byte", "vocab_size": null, "max_steps": null, "n_epochs": null, "batch_size": 16,
  "grad_accum": 1, "optimizer": "adamw", "learning_rate": 0.001, "min_lr": null, "warmup_steps": null,
  "schedule": "cosine", "cos_decay_steps": null, "cos_decay_restart": 1.1, "cos_decay_alpha": 0.0,
  "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-08, "grad_clip": 1.0,
  "activation_checkpointing": false, "eval_every": 100, "eval_batches": 20, "val_fraction": 0.1,
  "checkpoint_every": 500, "keep_checkpoints": 3, "samples_after_nl": false, "seed": 1337,
  "device": "auto", "dtype": "auto", "compile": false, "time_limit": null, "log_every": 1
};

export const MODEL_DEFAULTS = {
  "n_layer": 2, "n_head": 4, "n_kv_head": null, "n_embd": 128, "ctx": 128, "rope_dims": null,
  "rope_theta": 10000.0, "ffn_dim": null, "multiple_of": 32, "norm_eps": 1e-05, "tie_embeddings": false
};

export const PRESETS = {
  "llama-tiny": {"n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64, "ctx": 128},
  "llama-260k": {"n_layer": 5, "n_head": 8, "n_kv_head": 4, "n_embd": 64, "ctx": 512},
  "llama-15m": {"n_layer": 6, "n_head": 6, "n_embd": 288, "ctx": 256},
  "llama-42m": {"n_layer": 8, "n_head": 8, "n_embd": 512, "ctx": 1024},
  "llama-110m": {"n_layer": 12, "n_head": 12, "n_embd": 768, "ctx": 1024}
};

// What a null default means (TrainConfig's resolved_* rules), shown as the field's placeholder.
export const NULL_MEANS = {
  vocab_size: "258 (byte) / 4096 (bpe)",
  max_steps: "1000 unless epochs set",
  n_epochs: "off (max steps decide)",
  min_lr: "learning rate / 10",
  warmup_steps: "min(100, steps / 10)",
  cos_decay_steps: "total steps",
  time_limit: "none",
  n_kv_head: "= n_head",
  rope_dims: "= head dim",
  ffn_dim: "llama rule (8/3 · n_embd)",
};

/** The architecture a preset gives, every ModelConfig field filled in. */
export function presetValues(name) {
  const v = { ...MODEL_DEFAULTS, ...(PRESETS[name] || {}) };
  if (v.n_kv_head === null) v.n_kv_head = v.n_head;
  return v;
}
