"""Where an inference worker decodes (issue 23): `inference_device` auto is the CPU on a machine
without CUDA, `cuda` there is refused when the worker starts (exit 2, naming the setting), and the
CPU path keeps float32 weights. A GPU inference worker's row does not make training jobs go to the
gpu queue. On CUDA: tests/trainer/test_cuda_inference.py."""

from __future__ import annotations

import secrets
import subprocess
from typing import Any

import pytest
import torch
from sqlalchemy import delete

from api.placement import gpu_worker_alive
from core.models import Worker, utcnow
from core.settings import Settings
from tests.fixtures.service import env_from_settings, fromscratch_cmd
from trainer.config import ModelConfig
from trainer.model.llama import Llama
from worker.inference_device import InferenceDevice, InferenceDeviceError, inference_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


@no_cuda
def test_auto_is_the_cpu_here_and_cuda_is_refused() -> None:
    assert inference_device("auto") == InferenceDevice("cpu") == inference_device("cpu")
    with pytest.raises(InferenceDeviceError, match="FROMSCRATCH_INFERENCE_DEVICE"):
        inference_device("cuda")
    model = InferenceDevice("cpu").place(
        Llama(ModelConfig(n_layer=1, n_head=2, n_embd=16, ctx=16, vocab_size=258))
    )
    assert {p.dtype for p in model.parameters()} == {torch.float32} and not model.training


@no_cuda
def test_an_inference_worker_told_cuda_without_one_does_not_start(settings: Settings) -> None:
    env = env_from_settings(settings, FROMSCRATCH_INFERENCE_DEVICE="cuda")
    done = subprocess.run(
        fromscratch_cmd("worker", "--queues", "inference"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "inference_device=cuda" in done.stderr and "no CUDA device" in done.stderr


def test_a_gpu_inference_worker_does_not_place_training_jobs(
    settings: Settings, session_factory: Any
) -> None:
    now, tag = utcnow(), secrets.token_hex(4)
    rows = {f"inference-{tag}@box": (["inference"], False), f"trainer-{tag}@box": (["gpu", "cpu"], True)}
    try:
        for worker_id, (queues, counts) in rows.items():
            with session_factory() as s:
                s.add(
                    Worker(
                        id=worker_id,
                        host="box",
                        pid=1,
                        queues=queues,
                        device_kind="cuda",
                        devices=1,
                        memory_bytes=80 << 30,
                        started_at=now,
                        seen_at=now,
                    )
                )
                s.commit()
                assert gpu_worker_alive(s, settings) is counts, worker_id
    finally:
        with session_factory() as s:
            s.execute(delete(Worker).where(Worker.id.in_(list(rows))))
            s.commit()
