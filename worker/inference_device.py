"""Where an inference worker decodes (issue 23): `inference_device` auto picks CUDA when the worker
sees a CUDA device, else the CPU; `cuda` on a machine without one is refused when the worker starts
(it would take requests it cannot serve as asked). On CUDA the weights are bfloat16 where the device
supports it (float16 else) and the KV cache follows them onto the device (trainer.sampling builds it
from the weights' device and dtype); on the CPU they stay float32, as before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from trainer.model.llama import Llama


class InferenceDeviceError(ValueError):
    """`inference_device` names a device this machine does not have."""


@dataclass(frozen=True)
class InferenceDevice:
    kind: str  # cpu | cuda

    @property
    def dtype(self) -> torch.dtype:
        import torch

        if self.kind != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16

    def place(self, model: Llama) -> Llama:
        """The model on this device in its inference dtype, in eval mode."""
        return model.to(device=self.kind, dtype=self.dtype).eval()


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def inference_device(setting: str) -> InferenceDevice:
    """The device `inference_device` (auto, cpu or cuda) means on this machine."""
    if setting == "cpu":
        return InferenceDevice("cpu")
    has_cuda = cuda_available()
    if setting == "cuda" and not has_cuda:
        raise InferenceDeviceError(
            "inference_device=cuda, but this worker sees no CUDA device: set FROMSCRATCH_INFERENCE_DEVICE "
            "to auto or cpu, or run the inference worker where a GPU is visible"
        )
    return InferenceDevice("cuda" if has_cuda else "cpu")
