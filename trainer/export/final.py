"""The exports a run writes of its final checkpoint (TrainConfig.export_formats): `fromscratch train`
writes them to `<out>/exports/`, the worker to its scratch folder before storing them.

Layout in `out_dir`: each format under its `path` in trainer.config.export_formats (`model.gguf`,
`hf/`, `model.onnx`), in FINAL_DTYPE (f32). The checkpoint is read once for all formats. A format
this model cannot be exported as (an ExportError, e.g. hf with partial RoPE) is reported in the
result instead of raised: the others are still written, and training's result stands."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainer.config.export_formats import FINAL_DTYPE, export_format
from trainer.export import ExportError, export_model


def export_final(ckpt_dir: Path, formats: Sequence[str], out_dir: Path) -> dict[str, Path | ExportError]:
    """{format: the path written, or the ExportError that stopped it}, in the order asked."""
    if not formats:
        return {}
    from trainer.checkpoint import load_checkpoint

    ckpt = load_checkpoint(ckpt_dir)
    name = f"fromscratch-{Path(ckpt_dir).resolve().name}"
    results: dict[str, Path | ExportError] = {}
    for fmt in formats:
        try:
            results[fmt] = export_model(
                ckpt.model_config,
                ckpt.model_state,
                ckpt.tokenizer,
                fmt,
                out_dir / export_format(fmt).path,
                FINAL_DTYPE,
                name=name,
            )
        except ExportError as err:
            results[fmt] = err
    return results
