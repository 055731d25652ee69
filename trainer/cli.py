"""`fromscratch train | sample | export`: thin adapters over trainer.loop/sampling/export.

The training options are generated from the TrainConfig dataclass (`x_y` -> `--x-y`), so the CLI
and the API share names and defaults by construction. Options default to "not given" and the
dataclass fills in its own defaults; that also lets `--resume` keep the interrupted run's settings
and override only the options given on the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any

from trainer.config import (
    DEFAULT_PRESET,
    MODEL_FIELDS,
    PRESETS,
    TRAIN_FIELDS,
    ConfigError,
    ModelConfig,
    TrainConfig,
    model_config_from_preset,
)

_UNSET: Any = argparse.SUPPRESS  # option absent from the namespace unless given

MODEL_HELP: dict[str, str] = {
    "n_layer": "transformer blocks",
    "n_head": "attention heads",
    "n_kv_head": "key/value heads (grouped-query attention; must divide --n-head)",
    "n_embd": "embedding width",
    "ctx": "context length in tokens",
    "rope_dims": "rotated dims per head (llama.cpp --rotmax); default the whole head",
    "rope_theta": "RoPE base frequency",
    "ffn_dim": "SwiGLU hidden width; default llama's rule 2/3*4*n_embd rounded up to --multiple-of",
    "multiple_of": "round the default FFN width up to a multiple of this",
    "norm_eps": "RMSNorm epsilon",
    "tie_embeddings": "share the token embedding with the output projection",
}

TRAIN_HELP: dict[str, str] = {
    "tokenizer": "byte: 256 bytes + BOS/EOS, lossless; bpe: byte-level BPE trained on DATA",
    "vocab_size": "BPE vocabulary size (bpe only; unset = 4096)",
    "max_steps": "optimizer steps (unset and no --n-epochs = 1000)",
    "n_epochs": "train for this many passes over the data instead of --max-steps",
    "batch_size": "sequences per micro-batch",
    "grad_accum": "micro-batches accumulated per optimizer step (batch = batch-size x grad-accum)",
    "optimizer": "adamw or lbfgs",
    "learning_rate": "peak learning rate",
    "min_lr": "floor of the cosine schedule (unset = learning-rate / 10)",
    "warmup_steps": "linear warmup steps (unset = min(100, total steps / 10))",
    "schedule": "learning-rate schedule after warmup",
    "cos_decay_steps": "cosine-restarts: length of the first cycle (unset = total steps)",
    "cos_decay_restart": "cosine-restarts: each cycle is this factor longer than the previous",
    "cos_decay_alpha": "cosine-restarts: floor as a fraction of the learning rate",
    "weight_decay": "AdamW weight decay (2-D weights only)",
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "eps": "AdamW epsilon",
    "grad_clip": "clip the gradient norm to this (0 disables)",
    "activation_checkpointing": "recompute activations in the backward pass (less memory, ~30%% slower)",
    "eval_every": "evaluate the validation loss every N steps (0 disables)",
    "eval_batches": "batches per evaluation",
    "val_fraction": "fraction of the tokens (the last ones) held out for validation",
    "checkpoint_every": "write a checkpoint every N steps (0 = only the final one)",
    "keep_checkpoints": "keep the newest K step checkpoints (best/ and final/ are kept too)",
    "samples_after_nl": "start training windows only after a newline (llama.cpp --samples-after-nl)",
    "seed": "random seed (weights init and data order)",
    "device": "auto = cuda when available",
    "dtype": "auto = bfloat16 on CUDA when supported, else float32; bfloat16 autocasts on CPU too",
    "compile": "torch.compile the model",
    "time_limit": "stop (with a checkpoint) after this many seconds of training",
    "log_every": "steps between loss reports",
}


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _arg_spec(tp: Any) -> dict[str, Any]:
    """argparse kwargs for a dataclass field type: int/float/str, X | None, Literal[...], bool."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0]
    if tp is bool:
        return {"action": "store_true"}
    if typing.get_origin(tp) is typing.Literal:
        choices = list(typing.get_args(tp))
        return {"choices": choices, "metavar": "|".join(choices)}
    return {"type": tp, "metavar": tp.__name__.upper()}


def _default_text(value: Any) -> str:
    return "unset" if value is None else str(value)


def _add_train_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train", help="train a llama from scratch on a text/JSONL file", allow_abbrev=False,
        usage="fromscratch train DATA --out DIR [options]  (see --help)",
        description="Train a LLaMA-architecture model from scratch. Writes OUT/metrics.jsonl, "
                    "OUT/checkpoints/step-XXXXXXXX/, OUT/best/ and OUT/final/.")
    p.add_argument("data", metavar="DATA", type=Path, help="training data: a UTF-8 text file or JSONL")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --out (its settings, overridden by options "
                        "given here, e.g. a larger --max-steps)")
    p.add_argument("--init-from", type=Path, metavar="CKPT", default=None,
                   help="start from this checkpoint's weights, tokenizer and architecture with a fresh optimizer")
    p.add_argument("--validation-file", type=Path, metavar="PATH", default=None,
                   help="separate validation data (default: split off --val-fraction of DATA)")
    p.add_argument("--samples", type=int, default=2, metavar="N",
                   help="samples printed after training (default: 2)")

    model = p.add_argument_group("model (defaults come from --preset)")
    model.add_argument("--preset", default=DEFAULT_PRESET, choices=list(PRESETS), metavar="NAME",
                       help=f"architecture preset: {', '.join(PRESETS)} (default: {DEFAULT_PRESET})")
    hints = typing.get_type_hints(ModelConfig)
    preset_defaults = ModelConfig(**PRESETS[DEFAULT_PRESET])
    for name in MODEL_FIELDS:
        default = getattr(preset_defaults, name)
        model.add_argument(_option(name), dest=name, default=_UNSET, **_arg_spec(hints[name]),
                           help=f"{MODEL_HELP.get(name, name)} (default: preset; {DEFAULT_PRESET}: "
                                f"{_default_text(default)})")

    tg = p.add_argument_group("training (names and defaults shared with the API's hyperparameters)")
    hints = typing.get_type_hints(TrainConfig)
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for name in TRAIN_FIELDS:
        tg.add_argument(_option(name), dest=name, default=_UNSET, **_arg_spec(hints[name]),
                           help=f"{TRAIN_HELP.get(name, name)} (default: {_default_text(defaults[name])})")
    p.set_defaults(func=cmd_train, _parser=p)


def _config_error(parser: argparse.ArgumentParser, err: ConfigError) -> typing.NoReturn:
    parser.error("; ".join(f"{_option(name)}: {msg}" for name, msg in err.problems))


def _first_prompt(path: Path) -> str:
    """A short prompt for the post-training samples: the start of the first document."""
    try:
        from trainer.dataformat import iter_documents

        doc = next(iter(iter_documents(path)), "")
    except Exception:  # samples are a courtesy; never fail the command over them
        return ""
    line = doc.lstrip().split("\n", 1)[0]
    return line[:24]


def cmd_train(args: argparse.Namespace) -> int:
    from trainer.checkpoint import latest_checkpoint, load_checkpoint
    from trainer.dataformat import DataError
    from trainer.loop import TrainingDiverged, train
    from trainer.progress import ProgressCallbacks
    from trainer.sampling import generate

    parser: argparse.ArgumentParser = args._parser
    given = vars(args)
    train_values = {n: given[n] for n in TRAIN_FIELDS if n in given}
    model_values = {n: given[n] for n in MODEL_FIELDS if n in given}
    resume_from = latest_checkpoint(args.out) if args.resume else None
    try:
        model_cfg = model_config_from_preset(args.preset, **model_values)
        if resume_from is not None:  # the interrupted run's settings, then what was given now
            saved = load_checkpoint(resume_from).train_config.to_dict()
            train_cfg = TrainConfig(**{**saved, **train_values})
        else:
            train_cfg = TrainConfig(**train_values)
    except ConfigError as err:
        _config_error(parser, err)
    if not args.data.is_file():
        parser.error(f"DATA: {args.data} is not a file")
    if args.validation_file is not None and not args.validation_file.is_file():
        parser.error(f"--validation-file: {args.validation_file} is not a file")
    if resume_from is not None:
        print(f"resuming from {resume_from}")
        if model_values:
            print("note: the architecture comes from the checkpoint; model options are ignored")
    progress = ProgressCallbacks()
    try:
        result = train(model_cfg, train_cfg, args.data, args.out, progress, validation_path=args.validation_file,
                       resume=args.resume, init_from=args.init_from)
    except ConfigError as err:
        progress.close()
        _config_error(parser, err)
    except DataError as err:
        progress.close()
        where = "DATA"
        if "validation" in str(err):
            where = "--validation-file" if args.validation_file else "--val-fraction"
        parser.error(f"{where}: {err}")
    except FileExistsError as err:
        progress.close()
        parser.error(f"--out: {err}")
    except TrainingDiverged as err:
        progress.close()
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        progress.close()

    val = f", best val_loss {result.best_val_loss:.4f}" if result.best_val_loss is not None else ""
    print(f"{result.stop_reason} at step {result.step} ({result.tokens_seen:,} tokens){val}; "
          f"checkpoint: {result.final_checkpoint}")
    if result.stop_reason == "completed" and args.samples > 0 and result.final_checkpoint is not None:
        from trainer.checkpoint import load_model

        model, tokenizer = load_model(result.final_checkpoint)
        prompt = _first_prompt(args.data)
        for i in range(args.samples):
            text = generate(model, tokenizer, prompt, max_new_tokens=120, temperature=0.8, top_k=40,
                            seed=train_cfg.seed + i)
            print(f"--- sample {i + 1} ---\n{prompt}{text}")
    return 0


def _add_sample_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("sample", help="generate text from a checkpoint",
                              description="Print the prompt followed by a generated continuation.")
    p.add_argument("ckpt", metavar="CKPT", type=Path, help="checkpoint folder (e.g. OUT/final)")
    p.add_argument("--prompt", default="", metavar="TEXT", help="prompt text (default: empty = start from BOS)")
    p.add_argument("--max-new-tokens", type=int, default=200, metavar="N", help="tokens to generate (default: 200)")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T",
                   help="sampling temperature; 0 = greedy (default: 0.8)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample from the K likeliest tokens (default: off)")
    p.add_argument("--top-p", type=float, default=None, metavar="P", help="nucleus sampling mass (default: off)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="random seed (default: random)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="(default: cpu)")
    p.set_defaults(func=cmd_sample, _parser=p)


def cmd_sample(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args._parser
    if args.max_new_tokens < 0:
        parser.error(f"--max-new-tokens: must be >= 0, got {args.max_new_tokens}")
    if args.temperature < 0:
        parser.error(f"--temperature: must be >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k <= 0:
        parser.error(f"--top-k: must be positive, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        parser.error(f"--top-p: must be in (0, 1], got {args.top_p}")
    from trainer.checkpoint import CheckpointError, load_model
    from trainer.sampling import generate

    try:
        model, tokenizer = load_model(args.ckpt, device=args.device)
    except (CheckpointError, FileNotFoundError) as err:
        parser.error(f"CKPT: {err}")
    text = generate(model, tokenizer, args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    print(args.prompt + text)
    return 0


def _add_export_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("export", help="export a checkpoint as GGUF, Hugging Face or ONNX",
                              description="Export a checkpoint folder for llama.cpp (gguf), transformers (hf) "
                                          "or onnxruntime (onnx).")
    p.add_argument("ckpt", metavar="CKPT", type=Path, help="checkpoint folder (e.g. OUT/final)")
    p.add_argument("--format", required=True, choices=["gguf", "hf", "onnx"], help="output format")
    p.add_argument("--out", required=True, type=Path, metavar="PATH",
                   help="output file (gguf, onnx) or folder (hf)")
    p.add_argument("--dtype", default="f32", choices=["f32", "f16", "q8_0"],
                   help="weight type (q8_0: gguf only) (default: f32)")
    p.set_defaults(func=cmd_export, _parser=p)


def cmd_export(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args._parser
    from trainer.checkpoint import CheckpointError, read_state
    from trainer.export import export

    try:
        read_state(args.ckpt)
    except CheckpointError as err:
        parser.error(f"CKPT: {err}")
    try:
        out = export(args.ckpt, args.format, args.out, dtype=args.dtype)
    except ValueError as err:  # e.g. a dtype the format does not support
        parser.error(str(err))
    print(out)
    return 0


def register(subparsers: Any) -> None:
    _add_train_parser(subparsers)
    _add_sample_parser(subparsers)
    _add_export_parser(subparsers)
