"""Fused float32 CPU kernels for RMSNorm, the q/k/v split with RoPE, and SwiGLU (trainer/model/cpu_kernels.c).

Why: at the widths this service trains on a CPU (128-512), a step's matmuls already run near the
machine's peak, and what separates a llama step from a GPT-2 one is element-wise work: torch's eager
ops read and write the activations 3 to 9 times for each of these (RMSNorm's backward alone is 8
passes), where one pass suffices. The C file is compiled on first use with the machine's C compiler
(-O3 -march=native -ffast-math -fopenmp) into a per-user cache keyed by the source, the flags, the
compiler and the CPU, and called through ctypes on the tensors' memory. It uses the OpenMP runtime
torch already loaded, with torch's thread count.

Where there is no compiler, no Linux, another dtype or device, or FROMSCRATCH_CPU_KERNELS=0,
`available()` is False and trainer.model.fused_ops uses torch ops, which compute the same values.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC")
# Linked apart from the compile: gcc < 13 links crtfastmath.o into a -shared -ffast-math library,
# which turns on flush-to-zero for the whole process (torch's ops included) when it is loaded.
LINK_FLAGS = ("-shared", "-fopenmp")
DISABLE_ENV = "FROMSCRATCH_CPU_KERNELS"  # "0": use torch ops

_P, _I, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "rmsnorm_fwd": [_P, _P, _P, _P, _I, _I, ctypes.c_float, _INT],
    "rmsnorm_bwd": [_P, _P, _P, _P, _P, _P, _P, _I, _I, _INT],
    "swiglu_fwd": [_P, _P, _I, _I, _INT],
    "swiglu_bwd": [_P, _P, _P, _I, _I, _INT],
    "qkv_fwd": [_P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _INT],
    "qkv_bwd": [_P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _INT],
}
GRAIN_SIZE = 32768
WEIGHT_GRAD_BLOCKS = 16  # as in the C file: rmsnorm_bwd's scratch is this many rows of c floats


class KernelsUnavailable(RuntimeError):
    pass


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise KernelsUnavailable("no C compiler (set CC or install gcc)")
    return cc


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fromscratch" / "cpu-kernels"


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU model and flags (the cache may be shared by machines)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags", "Features"))}))


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), " ".join(FLAGS + LINK_FLAGS), version, _cpu_signature()]).encode()
    ).hexdigest()[:20]
    target = _cache_dir() / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        out_dir = target.parent
    except OSError:  # no writable home: build for this process only
        out_dir = Path(tempfile.mkdtemp(prefix="fromscratch-kernels-"))
        target = out_dir / target.name
    # Build beside the target and rename: concurrent workers never load a half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    obj = tmp[: -len(".so")] + ".o"
    try:
        for cmd in ([cc, *FLAGS, "-c", "-o", obj, str(SOURCE)], [cc, *LINK_FLAGS, "-o", tmp, obj, "-lm"]):
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise KernelsUnavailable(f"{cc} failed: {r.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        for leftover in (tmp, obj):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return target


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(the library, how it was got) or (None, why not)."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None, f"torch ops ({DISABLE_ENV}=0)"
    if sys.platform != "linux":
        return None, "torch ops (fused kernels are built on Linux only)"
    try:
        path = _build(_compiler())
        lib = ctypes.CDLL(str(path))
    # RuntimeError: Path.home() when the user has no home directory
    except (KernelsUnavailable, OSError, RuntimeError, subprocess.SubprocessError) as e:
        return None, f"torch ops (fused kernels unavailable: {e})"
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, None
    return lib, f"fused C kernels ({path.name})"


def available() -> bool:
    return _load()[0] is not None


def description() -> str:
    """One line for the run's start-up output: which element-wise kernels the CPU path uses."""
    return _load()[1]


def for_run(device_type: str, dtype: torch.dtype, compiled: bool) -> str:
    """What a run's element-wise ops run on, for its start-up output and checkpoint metadata."""
    if compiled:
        return "torch.compile (inductor fuses them)"
    if device_type == "cuda":
        from trainer.model import triton_kernels

        return triton_kernels.description()
    if device_type != "cpu" or dtype != torch.float32:
        return "torch ops"
    return description()


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels take these tensors: float32 on the CPU, and the library is there."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors) and available()


def _lib() -> ctypes.CDLL:
    lib = _load()[0]
    assert lib is not None, "check usable() first"
    return lib


def _threads(t: torch.Tensor) -> int:
    """torch's thread count, or 1 below torch's own grain size (at::internal::GRAIN_SIZE): waking a
    second thread costs more than it saves on a decoding step's few hundred values."""
    return torch.get_num_threads() if t.numel() >= GRAIN_SIZE else 1


def _rows(t: torch.Tensor, width: int) -> int:
    return t.numel() // width if width else 0


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / rms(x) * weight, 1 / rms(x)) over the last axis; x contiguous."""
    c = x.shape[-1]
    y = torch.empty_like(x)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32)
    _lib().rmsnorm_fwd(
        x.data_ptr(),
        weight.data_ptr(),
        y.data_ptr(),
        rstd.data_ptr(),
        _rows(x, c),
        c,
        eps,
        _threads(x),
    )
    return y, rstd


def rms_norm_backward(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight) of rms_norm_forward."""
    grad = grad.contiguous()
    c = x.shape[-1]
    dx, dw = torch.empty_like(x), torch.empty_like(weight)
    scratch = torch.empty(WEIGHT_GRAD_BLOCKS, c)
    _lib().rmsnorm_bwd(
        grad.data_ptr(), x.data_ptr(), weight.data_ptr(), rstd.data_ptr(), dx.data_ptr(), dw.data_ptr(),
        scratch.data_ptr(), _rows(x, c), c, _threads(x),
    )  # fmt: skip
    return dx, dw


def swiglu_forward(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up from h = [gate | up] on the last axis; h contiguous."""
    m = h.shape[-1] // 2
    out = torch.empty(*h.shape[:-1], m)
    _lib().swiglu_fwd(h.data_ptr(), out.data_ptr(), _rows(h, 2 * m), m, _threads(h))
    return out


def swiglu_backward(grad: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The gradient of h = [gate | up] from the output's."""
    grad = grad.contiguous()
    m = h.shape[-1] // 2
    dh = torch.empty_like(h)
    _lib().swiglu_bwd(grad.data_ptr(), h.data_ptr(), dh.data_ptr(), _rows(h, 2 * m), m, _threads(h))
    return dh


def qkv_forward(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv (B, T, H + 2 KV, hd), contiguous -> q (B, H, T, hd), k and v (B, KV, T, hd), contiguous,
    q and k rotated; cos/sin: contiguous (T, n_rot) rope_cache rows."""
    H, KV = heads
    B, T, _, hd = qkv.shape
    q, k, v = torch.empty(B, H, T, hd), torch.empty(B, KV, T, hd), torch.empty(B, KV, T, hd)
    _lib().qkv_fwd(
        qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
        B, T, H, KV, hd, cos.shape[-1], _threads(qkv),
    )  # fmt: skip
    return q, k, v


def qkv_backward(
    dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """The gradient of qkv_forward's input from those of q, k, v."""
    dq, dk, dv = dq.contiguous(), dk.contiguous(), dv.contiguous()
    B, H, T, hd = dq.shape
    KV = dk.shape[1]
    grad = torch.empty(B, T, H + 2 * KV, hd)
    _lib().qkv_bwd(
        dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), cos.data_ptr(), sin.data_ptr(), grad.data_ptr(),
        B, T, H, KV, hd, cos.shape[-1], _threads(grad),
    )  # fmt: skip
    return grad
