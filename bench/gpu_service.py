"""A job and a completion through the service on a GPU box (issue 23, bench/gpu_check.py's `service`
step): `fromscratch serve` as a user starts it, with no device setting, then a job without `device`
(it must be placed on the GPU queue: api/placement.py), a checkpoint every `--checkpoint-every`
steps (their cost in the background, from the job's "Checkpoints in the background" event), and a
completion of the trained model (the inference worker must decode on CUDA: GET /v1/workers), and
its logprobs recorded while decoding against one forward over the same text.

    python3 bench/gpu_service.py                          # on the GPU box: llama-42m, 300 steps
    .venv/bin/python bench/gpu_service.py --smoke --device cpu   # here: llama-tiny, CPU expected

Prints the figures and, for gpu_check.py's table, a GPU_CHECK_ROW line each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._gpu_rows import Row, emit
from bench._service import SHAKESPEARE, Service, machine, serve

STEP = "service"


def train_job(svc: Service, args: argparse.Namespace) -> dict[str, Any]:
    file_id = svc.upload(SHAKESPEARE)
    hyper = {"max_steps": args.steps, "batch_size": args.batch_size, "eval_every": 0}
    hyper["checkpoint_every"] = args.checkpoint_every
    started = time.perf_counter()
    job = svc.job(svc.create_job(file_id, args.preset, hyper))
    print(f"job {job['id']} queued on {job['queue']!r}", flush=True)
    emit(
        Row(
            STEP,
            "job without `device`: its queue",
            job["queue"],
            goal=f"{args.expect_queue}",
            met=job["queue"] == args.expect_queue,
        )
    )
    done = svc.wait_job(job["id"], timeout=args.timeout, poll=1.0)
    wall = time.perf_counter() - started
    metrics = svc.metrics(job["id"])
    rates = [p["tokens_per_s"] for p in metrics if p.get("tokens_per_s")]
    rate = sorted(rates)[len(rates) // 2] if rates else float("nan")
    print(f"job {done['id']} {done['status']} in {wall:.1f} s, median {rate:,.0f} tokens/s", flush=True)
    emit(Row(STEP, f"{args.preset} job: submit to succeeded", round(wall, 1), "s"))
    emit(Row(STEP, f"{args.preset} job: median training rate", rate, "tokens/s"))
    background_checkpoints(svc, done["id"])
    return done


def background_checkpoints(svc: Service, job_id: str) -> None:
    r = svc.client.get(f"/v1/fine_tuning/jobs/{job_id}/events", params={"limit": 1000})
    r.raise_for_status()
    for event in r.json()["data"]:
        if event["message"].startswith("Checkpoints in the background"):
            print(event["message"], flush=True)
            data = event.get("data") or {}
            emit(
                Row(
                    STEP,
                    f"checkpoints: {data.get('checkpoints')} written, training waited",
                    float(data.get("stall_seconds", float("nan"))),
                    "s",
                )
            )
            return
    emit(Row(STEP, "checkpoints in the background", "no event", goal="an event", met=False))


def completion(svc: Service, model: str, args: argparse.Namespace) -> None:
    body = {"model": model, "prompt": "ROMEO:", "max_tokens": args.tokens, "temperature": 0.8, "seed": 1}
    svc.client.post("/v1/completions", json={**body, "max_tokens": 4}).raise_for_status()  # loads it
    started = time.perf_counter()
    r = svc.client.post("/v1/completions", json=body)
    r.raise_for_status()
    seconds = time.perf_counter() - started
    tokens = r.json()["usage"]["completion_tokens"]
    print(f"completion: {tokens} tokens in {seconds:.2f} s (request to answer)", flush=True)
    emit(Row(STEP, "completion through the API", tokens / seconds, "tokens/s"))
    workers = svc.client.get("/v1/workers").json()["data"]
    kinds = sorted({w["device_kind"] for w in workers if any(q.startswith("inference") for q in w["queues"])})
    kind = ",".join(kinds) or "no inference worker"
    emit(
        Row(
            STEP,
            "inference worker's device",
            kind,
            goal=args.expect_queue_device,
            met=kind == args.expect_queue_device,
        )
    )


LOGPROB_TOLERANCE = 0.05  # nats: bf16 on CUDA; the same computation, one token at a time or in one pass


def logprobs_agree(svc: Service, model: str) -> None:
    """The logprobs recorded while decoding (beside the graphed decoder on CUDA) against those of
    one forward over the same text (echo scoring): the same model and tokens, so the same numbers."""
    # printable ASCII only (the byte tokenizer's ids are the bytes): text that encodes back to the
    # same tokens, however little the model learned; logprobs are the raw logits', bias or not
    ascii_only = {str(b): -100 for b in (*range(9), *range(11, 32), *range(127, 256))}
    body = {
        "model": model,
        "prompt": "ROMEO:",
        "max_tokens": 16,
        "temperature": 0.8,
        "seed": 1,
        "logprobs": 1,
        "logit_bias": ascii_only,
    }
    decoded = svc.client.post("/v1/completions", json=body).raise_for_status().json()["choices"][0]
    scoring = {
        "model": model,
        "prompt": "ROMEO:" + decoded["text"],
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
    }
    scored = svc.client.post("/v1/completions", json=scoring).raise_for_status().json()["choices"][0]
    tokens, logprobs = decoded["logprobs"]["tokens"], decoded["logprobs"]["token_logprobs"]
    n = len(tokens)
    if not n or scored["logprobs"]["tokens"][-n:] != tokens:  # e.g. bytes that are no UTF-8 text
        emit(Row(STEP, "logprobs while decoding vs one forward", "not comparable", goal="equal", met=None))
        return
    diff = max(abs(a - b) for a, b in zip(logprobs, scored["logprobs"]["token_logprobs"][-n:], strict=True))
    print(f"logprobs: {n} decoded tokens, largest difference from one forward {diff:.4f}", flush=True)
    goal = f"<= {LOGPROB_TOLERANCE}"
    emit(Row(STEP, "logprobs while decoding vs one forward", diff, "nats", goal, diff <= LOGPROB_TOLERANCE))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="the device the box has")
    ap.add_argument("--preset", default="llama-42m")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=64, help="tokens of the timed completion")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds the job may take")
    ap.add_argument("--smoke", action="store_true", help="llama-tiny, 6 steps, 8 tokens")
    args = ap.parse_args(argv)
    if args.smoke:
        args.preset, args.steps, args.batch_size, args.checkpoint_every, args.tokens = (
            "llama-tiny",
            6,
            4,
            3,
            8,
        )
    args.expect_queue = "gpu" if args.device == "cuda" else "cpu"
    args.expect_queue_device = args.device
    print(f"# gpu_service  {machine()}", flush=True)
    with serve(blob_backend="fs") as svc:
        done = train_job(svc, args)
        completion(svc, done["fine_tuned_model"], args)
        logprobs_agree(svc, done["fine_tuned_model"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
