"""What the API and the workers agree on about a model export (an `Export` row and its blob), so a
download finds the file whichever of them made it, and what a model downloads as. Import-light: no
torch (the client imports it too).

- The formats and dtypes come from trainer.config.export_formats; a download takes one of them or
  `checkpoint` (the stored checkpoint itself, DOWNLOAD_FORMATS). `served_export_formats()` is their
  JSON, served at GET /v1/fine_tuning/export_formats so the dashboard and clients keep no copy.
- `export_key(fmt, dtype)`: the row's `format`: the format itself for f32, `<format>-<dtype>` else.
- `export_filename(model_id, fmt, dtype)`: the file a download is named after: `<model>.gguf`,
  `<model>.onnx`, `<model>-hf.tar` (a folder format: one uncompressed tar of the folder, the folder
  `<model>-hf` at its root), with `-<dtype>` before the extension for other dtypes than f32.
- A failed row's `error` is `<code>: <message>` (`encode_error` / `decode_error`), so the API answers
  the status that fits: `export_failed` (the model cannot be exported as asked: 400),
  `quota_exceeded` (the file would pass the owner's storage quota: 429), `internal_error` (500).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from trainer.config.export_formats import (
    DEFAULT_DTYPE,
    DTYPES,
    FINAL_DEFAULT,
    FINAL_DTYPE,
    FORMAT_NAMES,
    FORMATS,
    ExportFormatSpec,
    export_format,
)

# Not an export: the stored checkpoint itself, one tar of the folder the trainer wrote (OUT/final/).
CHECKPOINT = ExportFormatSpec(
    "checkpoint",
    "Checkpoint",
    "the trainer's checkpoint folder as one tar (weights, configs, tokenizer, training progress; "
    "not the optimizer's state): `fromscratch train --init-from` starts a run from it, `--resume` "
    "continues its step and data order with a fresh optimizer",
    "final",
    is_folder=True,
    dtypes=(),
)
DOWNLOADS: tuple[ExportFormatSpec, ...] = (*FORMATS, CHECKPOINT)
DOWNLOAD_FORMATS: tuple[str, ...] = tuple(d.name for d in DOWNLOADS)
DEFAULT_DOWNLOAD = FORMAT_NAMES[0]
if TYPE_CHECKING:
    DownloadFormat = str
else:
    DownloadFormat = Literal[DOWNLOAD_FORMATS]
TAR_MEDIA_TYPE, FILE_MEDIA_TYPE = "application/x-tar", "application/octet-stream"

PREPARING, READY, FAILED = "preparing", "ready", "failed"
ERROR_CODES = ("export_failed", "quota_exceeded", "internal_error")


def safe_name(model_id: str) -> str:
    """A model id as a file name (colons and the like become dashes)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", model_id).strip("-") or "model"


def _dtype_suffix(dtype: str) -> str:
    return "" if dtype == DEFAULT_DTYPE else f"-{dtype}"


def export_key(fmt: str, dtype: str) -> str:
    return f"{fmt}{_dtype_suffix(dtype)}"


def export_folder_name(model_id: str, fmt: str, dtype: str) -> str:
    """A folder format's folder name at the root of its tar (`<model>-hf`)."""
    return f"{safe_name(model_id)}-{fmt}{_dtype_suffix(dtype)}"


def export_filename(model_id: str, fmt: str, dtype: str) -> str:
    spec = export_format(fmt)
    if spec.is_folder:
        return f"{export_folder_name(model_id, fmt, dtype)}.{spec.extension}"
    return f"{safe_name(model_id)}{_dtype_suffix(dtype)}.{spec.extension}"


def media_type(filename: str) -> str:
    return TAR_MEDIA_TYPE if filename.endswith(".tar") else FILE_MEDIA_TYPE


def served_export_formats() -> dict[str, Any]:
    """The download formats (every export format, then `checkpoint`) and dtypes as JSON."""
    return {
        "formats": [
            {
                "name": d.name,
                "title": d.title,
                "description": d.description,
                "extension": d.extension,
                "media_type": TAR_MEDIA_TYPE if d.is_folder else FILE_MEDIA_TYPE,
                "dtypes": list(d.dtypes),
            }
            for d in DOWNLOADS
        ],
        "dtypes": [{"name": name, "description": text} for name, text in DTYPES.items()],
        "default_format": DEFAULT_DOWNLOAD,
        "default_dtype": DEFAULT_DTYPE,
        "made_at_job_end": list(FINAL_DEFAULT),
        "job_end_dtype": FINAL_DTYPE,
    }


def encode_error(code: str, message: str) -> str:
    assert code in ERROR_CODES, code
    return f"{code}: {message}"


def decode_error(error: str | None) -> tuple[str, str]:
    """(code, message) of a failed row's `error`; an unknown form is an internal error."""
    code, sep, message = (error or "").partition(": ")
    if sep and code in ERROR_CODES:
        return code, message
    return "internal_error", error or "the export failed"
