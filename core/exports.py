"""What the API and the workers agree on about a model export (an `Export` row and its blob), so a
download finds the file whichever of them made it. Import-light: no torch.

- `export_key(fmt, dtype)`: the row's `format`: the format itself for f32, `<format>-<dtype>` else.
- `export_filename(model_id, fmt, dtype)`: the file a download is named after: `<model>.gguf`,
  `<model>.onnx`, `<model>-hf.tar` (one uncompressed tar of the Hugging Face folder, the folder
  `<model>-hf` at its root), with `-<dtype>` before the extension for other dtypes than f32.
- A failed row's `error` is `<code>: <message>` (`encode_error` / `decode_error`), so the API answers
  the status that fits: `export_failed` (the model cannot be exported as asked: 400),
  `quota_exceeded` (the file would pass the owner's storage quota: 429), `internal_error` (500).
"""

from __future__ import annotations

import re
from typing import Literal, get_args

ExportFormat = Literal["gguf", "hf", "onnx"]
ExportDtype = Literal["f32", "f16", "q8_0"]
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)
EXPORT_DTYPES: tuple[str, ...] = get_args(ExportDtype)

PREPARING, READY, FAILED = "preparing", "ready", "failed"
ERROR_CODES = ("export_failed", "quota_exceeded", "internal_error")


def safe_name(model_id: str) -> str:
    """A model id as a file name (colons and the like become dashes)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", model_id).strip("-") or "model"


def export_key(fmt: str, dtype: str) -> str:
    return fmt if dtype == "f32" else f"{fmt}-{dtype}"


def hf_folder_name(model_id: str, dtype: str) -> str:
    """The Hugging Face folder's name at the root of the hf tar."""
    suffix = "" if dtype == "f32" else f"-{dtype}"
    return f"{safe_name(model_id)}-hf{suffix}"


def export_filename(model_id: str, fmt: str, dtype: str) -> str:
    if fmt == "hf":
        return f"{hf_folder_name(model_id, dtype)}.tar"
    suffix = "" if dtype == "f32" else f"-{dtype}"
    return f"{safe_name(model_id)}{suffix}.{fmt}"


def media_type(filename: str) -> str:
    return "application/x-tar" if filename.endswith(".tar") else "application/octet-stream"


def encode_error(code: str, message: str) -> str:
    assert code in ERROR_CODES, code
    return f"{code}: {message}"


def decode_error(error: str | None) -> tuple[str, str]:
    """(code, message) of a failed row's `error`; an unknown form is an internal error."""
    code, sep, message = (error or "").partition(": ")
    if sep and code in ERROR_CODES:
        return code, message
    return "internal_error", error or "the export failed"
