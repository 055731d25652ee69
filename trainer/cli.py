"""`fromscratch train | sample | export`: thin adapters over trainer.run.loop/sampling/export (sample:
trainer/sample_cli.py).

The model and training options are generated from trainer.config's declarations by trainer.config.schema
(`x_y` -> `--x-y`), so the CLI and the API share names, defaults and bounds by construction. Options
default to "not given" and the config fills in its own defaults; that also lets `--resume` keep the
interrupted run's settings and override only the options given on the command line.
"""

from __future__ import annotations

import argparse
import signal
import sys
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config import (
    DEFAULT_PRESET,
    PRESETS,
    ConfigError,
    ModelConfig,
    TrainConfig,
    model_config_from_preset,
    schema,
)
from trainer.config.export_formats import DEFAULT_DTYPE, DTYPE_NAMES, FORMATS, dtypes_by_format
from trainer.config.train import TRAIN_GROUPS
from trainer.sample_cli import CKPT_HELP, INTERRUPTED, add_sample_parser, model_folder_of

if TYPE_CHECKING:
    from trainer.run.loop import TrainResult


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _export_paths() -> str:
    """The names exports get in OUT/exports/, e.g. `model.gguf, hf/, model.onnx`."""
    return ", ".join(f.path + ("/" if f.is_folder else "") for f in FORMATS)


def _add_train_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a llama from scratch on a text/JSONL file",
        allow_abbrev=False,
        usage="fromscratch train DATA --out DIR [options]  (see --help)",
        description="Train a LLaMA-architecture model from scratch. Writes OUT/metrics.jsonl, "
        "OUT/checkpoints/step-XXXXXXXX/, OUT/best/ (the lowest validation loss), OUT/final/ (the "
        "model: the last step's weights, or best/'s when the run ended past its best, e.g. stopped "
        "early; the last step's state then stays in OUT/checkpoints/ for --resume) and the "
        f"--export-formats of the model in OUT/exports/ ({_export_paths()}).",
    )
    p.add_argument("data", metavar="DATA", type=Path, help="training data: a UTF-8 text file or JSONL")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --out (its settings, overridden by options "
        "given here, e.g. a larger --max-steps)",
    )
    p.add_argument(
        "--init-from",
        type=Path,
        metavar="CKPT",
        default=None,
        help="start from this checkpoint's weights, tokenizer and architecture with a fresh optimizer",
    )
    p.add_argument(
        "--validation-file",
        type=Path,
        metavar="PATH",
        default=None,
        help="separate validation data (default: split off --val-fraction of DATA)",
    )
    p.add_argument(
        "--samples", type=int, default=2, metavar="N", help="samples printed after training (default: 2)"
    )

    groups = {
        name: p.add_argument_group(name, (group.__doc__ or "").strip())
        for name, group in TRAIN_GROUPS.items()
    }
    groups["model"].description = "The architecture (defaults come from --preset) and its initialization."
    groups["model"].add_argument(
        "--preset",
        default=None,
        choices=list(PRESETS),
        metavar="NAME",
        help=f"architecture preset: {', '.join(PRESETS)} (default: {DEFAULT_PRESET})",
    )
    # names and defaults shared with the API's hyperparameters
    schema.add_options(groups, schema.cli_options(), by="group")
    p.set_defaults(func=cmd_train, _parser=p)


def _config_error(parser: argparse.ArgumentParser, err: ConfigError) -> typing.NoReturn:
    parser.error("; ".join(f"{_option(name)}: {msg}" for name, msg in err.problems))


PROMPT_CHARS = 400  # the most of a record's prompt the samples start from (its end)


def _first_prompt(path: Path) -> str:
    """A prompt for the post-training samples: the first record's prompt when it has one (a
    prompt/completion's prompt, a chat up to the assistant's header), else the start of the text."""
    try:
        from trainer.data.formats import detect_format, iter_documents, iter_jsonl_documents

        if detect_format(path) == "jsonl":
            with open(path, encoding="utf-8") as lines:
                first = next(iter(iter_jsonl_documents(lines)))
            text, trained = first.segments[0]
            if not trained:  # the part the model is prompted with
                return text[-PROMPT_CHARS:]
        doc = next(iter(iter_documents(path)), "")
    except Exception:  # samples are a courtesy; never fail the command over them
        return ""
    line = doc.lstrip().split("\n", 1)[0]
    return line[:24]


def cmd_train(args: argparse.Namespace) -> int:
    from trainer.checkpoint import latest_checkpoint

    parser: argparse.ArgumentParser = args._parser
    resume_from = latest_checkpoint(args.out) if args.resume else None
    model_cfg, train_cfg = _configs(args, resume_from)
    if not args.data.is_file():
        parser.error(f"DATA: {args.data} is not a file")
    if args.validation_file is not None and not args.validation_file.is_file():
        parser.error(f"--validation-file: {args.validation_file} is not a file")
    _check_paths(parser, args)
    _check_continuing(parser, args, resume_from)
    result = _train_reporting_errors(args, model_cfg, train_cfg)
    if result is None:
        return 1
    val = f", best val_loss {result.best_val_loss:.4f}" if result.best_val_loss is not None else ""
    print(
        f"{result.stop_reason} at step {result.step} ({result.tokens_seen:,} tokens){val}; "
        f"{'model' if result.model_step is not None else 'checkpoint'}: {result.final_checkpoint}"
    )
    if result.model_note is not None:
        print(f"{result.model_note}.")
    if (checkpoints := result.checkpoint_times.summary()) is not None:
        print(f"{checkpoints}.")
    if result.stop_reason in ("stop", "pause"):  # Ctrl-C (ProgressCallbacks): stopped short, resumable
        print(f"continue it with: fromscratch train {args.data} --out {args.out} --resume", file=sys.stderr)
        return INTERRUPTED
    if result.final_checkpoint is None or result.model_step is None:
        return 0
    _write_exports(result.final_checkpoint, train_cfg.export_formats, args.out / "exports")
    if result.stop_reason != "time_limit" and args.samples > 0:
        _print_samples(result.final_checkpoint, args.data, args.samples, train_cfg.seed)
    return 0


def _check_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--out, --init-from and --resume, checked before anything is read or written."""
    from trainer.checkpoint import CheckpointError, read_state

    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out: {args.out} is a file, not a folder")
    if args.init_from is None:
        return
    if args.resume:
        parser.error(
            "--init-from: a resumed run continues from its own checkpoint; give --resume or --init-from"
        )
    try:
        read_state(args.init_from)
    except CheckpointError as err:
        parser.error(f"--init-from: {err}")


# the option that sets each field of the data order a resumed run must keep (batches.ResumeMismatch)
_RESUME_FIELDS = {"seed": "--seed", "samples_after_nl": "--samples-after-nl", "masked": "--train-on-inputs"}


def _configs(args: argparse.Namespace, resume_from: Path | None) -> tuple[ModelConfig, TrainConfig]:
    """The run's configs from the options given; resuming (`resume_from`: the newest checkpoint in
    --out) the interrupted run's training settings, overridden by the options given now (its
    architecture comes from the checkpoint)."""
    from trainer.checkpoint import checkpoint_configs

    given = vars(args)
    train_values = {
        h.name: given[h.name] for h in schema.cli_options() if h.name in given and h.section == "train"
    }
    try:
        model_cfg = model_config_from_preset(args.preset or DEFAULT_PRESET, **_model_values(args))
        saved = checkpoint_configs(resume_from)[1].to_dict() if resume_from is not None else {}
        train_cfg = TrainConfig(**{**saved, **train_values})
    except ConfigError as err:
        _config_error(args._parser, err)
    if args.resume and resume_from is None:
        print(f"--resume: no checkpoint in {args.out} to continue from; starting a new run")
    if resume_from is not None:
        print(f"resuming from {resume_from}")
    return model_cfg, train_cfg


def _model_values(args: argparse.Namespace) -> dict[str, Any]:
    """The architecture options given on the command line."""
    given = vars(args)
    return {h.name: given[h.name] for h in schema.cli_options() if h.name in given and h.section == "model"}


def _check_continuing(
    parser: argparse.ArgumentParser, args: argparse.Namespace, resume_from: Path | None
) -> None:
    """A run continuing a checkpoint takes its architecture and tokenizer: an option (or --preset)
    setting one to another value than the checkpoint's is refused, naming it (as the API refuses
    it when continuing a model); the same value is accepted, so that the command line of the run
    can be given again with --resume. --resume with nothing to resume starts a new run."""
    from trainer.checkpoint import CheckpointError, checkpoint_configs

    continued: Path | None = args.init_from or resume_from
    if continued is None:
        return
    source = "--init-from" if args.init_from else "--resume"
    try:
        saved_model, saved_train = checkpoint_configs(continued)
    except CheckpointError as err:
        parser.error(f"{source}: {err}")
    given = vars(args)
    fixed = [h for h in schema.cli_options() if h.from_source]
    asked = {h.name: given[h.name] for h in fixed if h.name in given}
    option = {h.name: h.option for h in fixed}
    model_fields = {h.name for h in fixed if h.section == "model"}
    if args.preset is not None:  # the preset's architecture, with the options given over it
        preset_cfg = model_config_from_preset(args.preset, **_model_values(args))
        asked = {**{name: getattr(preset_cfg, name) for name in model_fields}, **asked}
        option |= {name: f"--preset {args.preset}" for name in asked if name not in given}
    for name, value in asked.items():
        saved = getattr(saved_model if name in model_fields else saved_train, name)
        if value != saved:
            parser.error(
                f"{option[name]}: the checkpoint {source} continues has {name} {saved}, not {value}; "
                "the architecture and the tokenizer come from the checkpoint: leave it out (start a "
                "new run to change them)"
            )


def _train_reporting_errors(
    args: argparse.Namespace, model_cfg: ModelConfig, train_cfg: TrainConfig
) -> TrainResult | None:
    """_train, with a bad input reported as a usage error naming the option; None when the run
    diverged (said on stderr)."""
    from trainer.checkpoint import CheckpointError
    from trainer.data.batches import ResumeMismatch
    from trainer.data.formats import DataError
    from trainer.run.report import TrainingDiverged

    parser: argparse.ArgumentParser = args._parser
    try:
        return _train(args, model_cfg, train_cfg)
    except ConfigError as err:
        _config_error(parser, err)
    except DataError as err:
        parser.error(f"{_data_option(args, err)}: {err}")
    except ResumeMismatch as err:
        option = next((_RESUME_FIELDS[f] for f in err.fields if f in _RESUME_FIELDS), "DATA")
        parser.error(f"{option}: a resumed run keeps the data and the order it was drawn in: {err}")
    except CheckpointError as err:
        parser.error(f"{'--resume' if args.resume else '--init-from'}: {err}")
    except FileExistsError as err:
        parser.error(f"--out: {err}")
    except OSError as err:  # --out cannot be made or written (a file in its path, no permission)
        if err.filename is None or not str(err.filename).startswith(str(args.out)):
            raise
        parser.error(f"--out: cannot write {err.filename}: {err.strerror}")
    except TrainingDiverged as err:
        print(f"error: {err}", file=sys.stderr)
        return None


def _data_option(args: argparse.Namespace, err: Exception) -> str:
    """Which input a DataError is about: the validation file when it names it, else DATA."""
    named = str(err)
    if (
        args.validation_file is not None
        and args.validation_file.name in named
        and args.data.name not in named
    ):
        return "--validation-file"
    if "validation" in named:
        return "--validation-file" if args.validation_file else "--val-fraction"
    return "DATA"


def _train(args: argparse.Namespace, model_cfg: ModelConfig, train_cfg: TrainConfig) -> TrainResult:
    """Train in this process with a progress display, or over `devices` processes (rank 0 shows
    the progress)."""
    from trainer.run.loop import train
    from trainer.run.progress import ProgressCallbacks

    inputs: dict[str, typing.Any] = dict(
        validation_path=args.validation_file, resume=args.resume, init_from=args.init_from
    )
    if train_cfg.devices == 1:
        progress = ProgressCallbacks()
        try:
            return train(model_cfg, train_cfg, args.data, args.out, progress, **inputs)
        finally:
            progress.close()
    from trainer.distributed.launch import launch_train

    # Ctrl-C goes to rank 0 (its progress callbacks stop the run with a checkpoint), not to the
    # launcher, which would kill the ranks; the ranks inherit the ignored signal
    old_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return launch_train(model_cfg, train_cfg, args.data, args.out, ProgressCallbacks, **inputs)
    finally:
        signal.signal(signal.SIGINT, old_handler)


def _print_samples(ckpt: Path, data: Path, count: int, seed: int) -> None:
    """`count` samples of the trained model, prompted with the start of the training data."""
    from trainer.checkpoint import load_model
    from trainer.sampling import generate

    model, tokenizer = load_model(ckpt)
    prompt = _first_prompt(data)
    for i in range(count):
        text = generate(
            model, tokenizer, prompt, max_new_tokens=120, temperature=0.8, top_k=40, seed=seed + i
        )
        print(f"--- sample {i + 1} ---\n{prompt}{text}")


def _write_exports(ckpt: Path, formats: typing.Sequence[str], out_dir: Path) -> None:
    """--export-formats of the model (final/) into OUT/exports/ (trainer.config.export_formats' paths).
    A format the model cannot be exported as is a warning: the trained model stands."""
    from trainer.export.final import export_final

    for fmt, written in export_final(ckpt, formats, out_dir).items():
        if isinstance(written, Path):
            print(f"export {fmt}: {written}")
        else:
            print(f"warning: no {fmt} export: {written}", file=sys.stderr)


def _add_export_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "export",
        help=f"export a checkpoint as {', '.join(f.title for f in FORMATS)}",
        description="Export a checkpoint folder: " + "; ".join(f"{f.name}: {f.description}" for f in FORMATS),
    )
    p.add_argument("ckpt", metavar="CKPT", type=Path, help=CKPT_HELP)
    p.add_argument("--format", required=True, choices=[f.name for f in FORMATS], help="output format")
    folders = [f.name for f in FORMATS if f.is_folder]
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="PATH",
        help=f"output file (a folder for {', '.join(folders)})" if folders else "output file",
    )
    p.add_argument(
        "--dtype",
        default=DEFAULT_DTYPE,
        choices=DTYPE_NAMES,
        help=f"weight type ({dtypes_by_format()}) (default: {DEFAULT_DTYPE})",
    )
    p.set_defaults(func=cmd_export, _parser=p)


def cmd_export(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args._parser
    from trainer.checkpoint import CheckpointError, read_state
    from trainer.export import export

    try:
        ckpt = model_folder_of(args.ckpt)
        read_state(ckpt)
    except CheckpointError as err:
        parser.error(f"CKPT: {err}")
    try:
        out = export(ckpt, args.format, args.out, dtype=args.dtype)
    except CheckpointError as err:  # a file of the folder missing or corrupt
        parser.error(f"CKPT: {err}")
    except ValueError as err:  # e.g. a dtype the format does not support
        parser.error(str(err))
    except OSError as err:  # the output cannot be written there (a file in its path, no permission)
        parser.error(f"--out: cannot write {args.out}: {err.strerror or err}")
    print(out)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_train_parser(subparsers)
    add_sample_parser(subparsers)
    _add_export_parser(subparsers)
