"""ONNX export: one graph `input_ids` (batch, seq) int64 -> `logits` (batch, seq, vocab) float32.

Made with torch's dynamo-based exporter (`torch.onnx.export(..., dynamo=True)`, torch >= 2.5), with
batch and sequence length dynamic (seq up to ctx). No KV cache: each call runs the whole sequence,
which is what a simple onnxruntime consumer wants.

The file is self-contained: its metadata (`metadata_props`) holds what a consumer needs besides the
graph: `tokenizer.json` (the Hugging Face `tokenizers` JSON of the model's tokenizer, as the hf
export writes it: `tokenizers.Tokenizer.from_str`), `bos_token_id`, `eos_token_id`,
`context_length` (inputs longer than it are refused by the graph) and `chat_template` (the
service's chat format, trainer.data.chat).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from trainer.config import ModelConfig
from trainer.data.chat import JINJA_CHAT_TEMPLATE
from trainer.data.tokenizers import Tokenizer
from trainer.export.common import ExportError, write_atomically

# A single protobuf file cannot exceed 2 GiB; larger models would need external data files.
MAX_SINGLE_FILE_BYTES = 2**31 - 2**26


class _LogitsOnly(torch.nn.Module):
    """Llama.forward returns (logits, loss); ONNX gets the logits only."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)[0]


def metadata(cfg: ModelConfig, tokenizer: Tokenizer) -> dict[str, str]:
    """The file's metadata_props (see the module docstring)."""
    from trainer.export.hf import hf_tokenizer_json

    return {
        "tokenizer.json": hf_tokenizer_json(tokenizer),
        "bos_token_id": str(tokenizer.bos_id),
        "eos_token_id": str(tokenizer.eos_id),
        "context_length": str(cfg.ctx),
        "chat_template": JINJA_CHAT_TEMPLATE,
    }


def write_onnx(
    cfg: ModelConfig, state: dict[str, torch.Tensor], tokenizer: Tokenizer, out: Path, dtype: str
) -> Path:
    from trainer.model.llama import Llama

    n_bytes = (
        sum(t.numel() for k, t in state.items() if not (cfg.tie_embeddings and k == "output.weight")) * 4
    )
    if n_bytes > MAX_SINGLE_FILE_BYTES:
        raise ExportError(
            f"the model's weights ({n_bytes / 2**30:.1f} GiB) exceed what one ONNX file can hold "
            "(2 GiB); export as gguf or hf instead"
        )
    model = Llama(cfg)
    model.load_state_dict(state, strict=True)
    wrapper = _LogitsOnly(model).eval()
    # Example sizes of 2+: the exporter specialises dims of size 0/1 to constants.
    example = torch.zeros(2, min(8, cfg.ctx), dtype=torch.long)
    batch = torch.export.Dim("batch", min=1, max=4096)
    # max=ctx lets the exporter prove the model's "sequence longer than ctx" check never fires.
    seq = torch.export.Dim("seq", min=1, max=cfg.ctx)

    def write(tmp: Path) -> None:
        with _quiet(*CHATTY_LOGGERS), warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # exporter deprecation chatter
            program = torch.onnx.export(
                wrapper,
                (example,),
                input_names=["input_ids"],
                output_names=["logits"],
                dynamic_shapes={"input_ids": {0: batch, 1: seq}},
                dynamo=True,
                verbose=False,
            )
            assert program is not None  # the dynamo exporter returns its program
            program.model.metadata_props.update(metadata(cfg, tokenizer))  # written with the graph, once
            program.save(str(tmp), external_data=False)

    return write_atomically(out, write)


# The exporter logs that torchvision ops are unavailable, and onnx_ir a line per initializer it
# deduplicates (130 for llama-tiny): noise in a worker's log, so only their errors show.
CHATTY_LOGGERS = ("torch.onnx._internal.exporter._registration", "onnx_ir")


@contextlib.contextmanager
def _quiet(*names: str) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
