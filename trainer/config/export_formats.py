"""The one list of export formats and weight dtypes: what `fromscratch export` and the trainer's
exporters accept, the names a run's exports get, which dtypes each format takes and which formats a
run makes as it ends. Everything else derives from FORMATS and DTYPES below: the trainer's
`--format`/`--dtype` choices, TrainConfig.export_formats, the API's download parameters and file
names (core.exports), the served list (GET /v1/fine_tuning/export_formats) that the dashboard reads,
and the client's options. Adding a format is adding an entry here and its writer in trainer/export/.

Torch-free (the API and the HTTP client import it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Literal


@dataclass(frozen=True)
class ExportFormatSpec:
    """One export format: `path` is its name in a run's exports folder (OUT/exports/); a folder
    format downloads as one uncompressed tar of the folder."""

    name: str
    title: str
    description: str
    path: str
    is_folder: bool
    dtypes: tuple[str, ...]

    @property
    def extension(self) -> str:
        """The extension of its download: the file's own, or `tar` for a folder."""
        return "tar" if self.is_folder else PurePath(self.path).suffix.removeprefix(".")


# Weight dtypes, in the order of their size on disk (largest first), with what each is for.
DTYPES: dict[str, str] = {
    "f32": "32-bit floats: the trained weights as they are",
    "f16": "16-bit floats: half the size, logits within about 1e-2",
    "bf16": "bfloat16: half the size with f32's range (no overflow), a little coarser than f16",
    "q8_0": "8-bit blocks (llama.cpp Q8_0): about a quarter of the size",
}
DEFAULT_DTYPE = "f32"

FORMATS: tuple[ExportFormatSpec, ...] = (
    ExportFormatSpec(
        "gguf",
        "GGUF (llama.cpp)",
        "one file for llama.cpp and the tools built on it (llama-cpp-python, ollama, LM Studio)",
        "model.gguf",
        is_folder=False,
        dtypes=("f32", "f16", "bf16", "q8_0"),
    ),
    ExportFormatSpec(
        "hf",
        "Hugging Face",
        "a transformers folder: config.json, model.safetensors and the tokenizer",
        "hf",
        is_folder=True,
        dtypes=("f32", "f16", "bf16"),
    ),
    ExportFormatSpec(
        "onnx",
        "ONNX",
        "one file for onnxruntime: token ids in, logits out; the tokenizer and context length in its metadata "
        "(weights up to 2 GiB)",
        "model.onnx",
        is_folder=False,
        dtypes=("f32",),
    ),
)
FORMAT_NAMES: tuple[str, ...] = tuple(f.name for f in FORMATS)
DTYPE_NAMES: tuple[str, ...] = tuple(DTYPES)

# The exports a run makes of its final model unless told otherwise (TrainConfig.export_formats),
# always in FINAL_DTYPE; the others are made on first download.
FINAL_DEFAULT: tuple[str, ...] = ("gguf", "hf")
FINAL_DTYPE = DEFAULT_DTYPE

# Field types of the names (pydantic validates against these); mypy sees plain strings, as it
# cannot read a Literal built from a tuple.
if TYPE_CHECKING:
    ExportFormat = str
    ExportDtype = str
else:
    ExportFormat = Literal[FORMAT_NAMES]
    ExportDtype = Literal[DTYPE_NAMES]


def export_format(name: str) -> ExportFormatSpec:
    """The format named `name` (KeyError for an unknown one)."""
    for spec in FORMATS:
        if spec.name == name:
            return spec
    raise KeyError(name)


def dtypes_by_format() -> str:
    """Which dtypes each format takes, for a `--dtype` option's help: `gguf: f32, f16, q8_0; ...`."""
    return "; ".join(f"{f.name}: {', '.join(f.dtypes)}" for f in FORMATS)


def dtype_problem(fmt: str, dtype: str) -> str | None:
    """Why `fmt` cannot be written in `dtype`, or None when it can."""
    if fmt not in FORMAT_NAMES:
        return f"unknown export format {fmt!r}; choose one of {', '.join(FORMAT_NAMES)}"
    if dtype not in DTYPES:
        return f"unknown export dtype {dtype!r}; choose one of {', '.join(DTYPE_NAMES)}"
    spec = export_format(fmt)
    if dtype in spec.dtypes:
        return None
    others = [f.name for f in FORMATS if dtype in f.dtypes]
    hint = f" (use {' or '.join(others)} for {dtype})" if others else ""
    return f"the {spec.title} export supports dtype {' or '.join(spec.dtypes)} only, not {dtype}{hint}"
