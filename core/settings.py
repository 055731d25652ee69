"""One Settings object for every process (API, worker, CLI), read from `FROMSCRATCH_*` variables.

Paths that are not given derive from `data_dir` (database, broker, blobs, worker scratch), so
`FROMSCRATCH_DATA_DIR=d` alone configures a whole embedded install. SQLite URLs are made
absolute so a subprocess started from another working directory opens the same files.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

QUEUES = ("cpu", "gpu")  # training queues (a job's `queue`)
# completions and on-demand exports: a worker of its own, so a worker busy training never blocks them
INFERENCE_QUEUE = "inference"
WORKER_QUEUES = (*QUEUES, INFERENCE_QUEUE)
MAX_DEVICES = 64  # devices one job may ask for (a routed queue name `gpu.64` fits jobs.queue)
GiB = 1 << 30


def _absolute_sqlite_url(url: str, base: Path) -> str:
    """`sqlite:///rel.db` (or `sqla+sqlite:///rel.db`) -> absolute path resolved against `base`."""
    for scheme in ("sqlite:///", "sqla+sqlite:///"):
        if url.startswith(scheme):
            rest = url[len(scheme) :]
            path, sep, query = rest.partition("?")
            if not path or path == ":memory:" or path.startswith("/"):
                return url
            return f"{scheme}{(base / path).resolve()}{sep}{query}"
    return url


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FROMSCRATCH_", extra="ignore")

    data_dir: Path = Field(default=Path("~/.fromscratch"), description="root of every default path")
    # "" = derive from data_dir (see _derive); an explicit value wins
    database_url: str = Field(
        default="", description="SQLAlchemy URL (postgresql+psycopg://... or sqlite:///...)"
    )
    broker_url: str = Field(default="", description="Celery broker URL (redis://... or sqla+sqlite:///...)")
    # None = derive: "fs" (files under blob_dir) with the embedded SQLite database, else "db"
    blob_backend: Literal["db", "fs", "s3"] | None = Field(
        default=None, description="where new blobs go: db (chunked rows), fs (blob_dir) or s3 (s3_bucket)"
    )
    blob_dir: Path | None = None
    # -- the s3 blob backend (credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_REGION) --
    s3_endpoint_url: str = Field(
        default="", description="an S3-compatible server (http://seaweedfs:8333); empty = AWS"
    )
    s3_bucket: str = Field(default="", description="the bucket blobs go to (needed by blob_backend s3)")
    s3_prefix: str = Field(default="", description="key prefix of every blob object (a folder in the bucket)")
    s3_presigned_downloads: bool = Field(
        default=False, description="model downloads redirect to a presigned S3 URL instead of streaming"
    )
    s3_public_endpoint_url: str = Field(
        default="", description="the endpoint clients reach, for presigned URLs; empty = s3_endpoint_url"
    )
    max_upload_bytes: int = Field(default=GiB, gt=0)
    lease_seconds: float = Field(default=30.0, gt=0)
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    worker_queues: str = "cpu"  # comma-separated
    default_queue: Literal["cpu", "gpu"] = "cpu"
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    work_dir: Path | None = None
    metrics_flush_seconds: float = Field(default=1.0, gt=0)
    reaper_interval_seconds: float = Field(default=5.0, gt=0)

    # -- what one job may ask for (checked by the API before anything is queued) --
    # memory of the largest worker of each queue: a job whose estimate exceeds it is refused
    cpu_worker_memory_bytes: int = Field(default=16 * GiB, gt=0)
    gpu_worker_memory_bytes: int = Field(default=80 * GiB, gt=0)
    max_job_steps: int = Field(default=1_000_000, gt=0, description="optimizer steps one job may run")
    max_job_tokens: int = Field(
        default=20_000_000_000,
        gt=0,
        description="tokens one job may process: training (steps x batch x ctx) and what its evaluations read",
    )
    max_checkpoints_per_job: int = Field(default=20, ge=1, description="step checkpoints kept per job")

    # -- devices (issue 12; docs/ARCHITECTURE.md "Devices and worker classes") --
    # The API admits a job asking for `devices: N` only when a worker class of its queue has N
    # devices; the job waits in the queue `<queue>.<N>` (core/device_queues.py) for such a worker.
    cpu_worker_devices: int = Field(
        default=1, ge=1, le=MAX_DEVICES, description="devices (processes) of the largest cpu worker"
    )
    gpu_worker_devices: int = Field(
        default=1, ge=1, le=MAX_DEVICES, description="GPUs of the largest gpu worker (one worker per node)"
    )
    worker_devices: int = Field(
        default=0,
        ge=0,
        le=MAX_DEVICES,
        description="devices this worker runs one job on; 0 = all it has (the CUDA devices of a gpu "
        "worker, 1 for a cpu worker); more than it has and the worker refuses to start",
    )

    # -- quotas per API key (429 with Retry-After when exceeded) --
    max_active_jobs_per_key: int = Field(default=32, ge=1, description="queued + running + validating")
    max_running_jobs_per_key: int = Field(default=4, ge=1)
    max_files_per_key: int = Field(
        default=10_000, ge=1, description="uploaded files one key keeps (429 past it; deleting frees one)"
    )
    max_completions_per_key: int = Field(
        default=4, ge=1, description="completions one key has queued or running at once (429 past it)"
    )
    max_stored_bytes_per_key: int = Field(
        default=50 * GiB, gt=0, description="files + checkpoints + exports an owner keeps"
    )
    rate_limit: str = Field(default="50/second", description="requests per key (`limits` syntax)")
    rate_limit_storage_url: str = Field(
        default="", description="`limits` storage (redis://...); empty = the broker's Redis, else memory"
    )

    metrics_token: str = Field(
        default="",
        description="when set, /metrics answers only `Authorization: Bearer <this>` (its labels name "
        "every tenant's running jobs); empty = open, for a scraper on a private network",
    )

    # -- robustness --
    upload_body_timeout_seconds: float = Field(default=30.0, gt=0, description="silence allowed mid-upload")
    request_read_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="a request's head, and a JSON body, must arrive within it (408 past it)",
    )
    # request heads, refused by the HTTP protocol before the app sees them (api/http_server.py)
    max_request_head_bytes: int = Field(
        default=32 * 1024, ge=1024, description="request line + headers, bytes (431 past it)"
    )
    max_request_headers: int = Field(default=100, ge=8, description="header fields of a request (431)")
    max_request_line_bytes: int = Field(
        default=8 * 1024, ge=256, description="one header line (431) or the URL (414), bytes"
    )
    max_json_depth: int = Field(
        default=64,
        ge=2,
        le=500,  # far below Python's recursion limit: the parsers never get near it
        description="nesting of a JSON body or of a JSONL record (400 past it)",
    )
    stream_key_recheck_seconds: float = Field(default=5.0, gt=0, description="SSE re-checks its key")
    max_streams_per_key: int = Field(
        default=16, ge=1, description="open streams (job SSE and streamed completions) per key (429 past it)"
    )
    stream_poll_threads: int = Field(
        default=8,
        ge=1,
        description="threads all streams' database polls share (the rest serve other requests)",
    )
    sse_keepalive_seconds: float = Field(
        default=10.0, gt=0, description="silence after which a completion stream sends `: keep-alive`"
    )
    # what a killed process leaves (api/leftovers.py, core/blob_gc.py)
    upload_leftover_seconds: float = Field(
        default=3600.0, gt=0, description="a temporary upload file untouched this long is a dead API's"
    )
    blob_writer_timeout_seconds: float = Field(
        default=60.0, gt=0, description="an incomplete blob whose writer was silent this long is collected"
    )
    leftover_sweep_seconds: float = Field(
        default=300.0, gt=0, description="how often the API collects leftovers (also at start-up)"
    )
    db_retry_seconds: float = Field(
        default=120.0, gt=0, description="how long a worker retries a failing database write"
    )

    # -- inference and exports (the `inference` queue's workers) --
    inference_concurrency: int = Field(
        default=4, ge=1, le=64, description="requests one inference worker serves at once (threads)"
    )
    inference_device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="where inference workers decode: auto picks CUDA when they see it"
    )
    max_loaded_models: int = Field(
        default=4, ge=1, description="models an inference worker keeps loaded (LRU)"
    )
    inference_wait_seconds: float = Field(
        default=60.0, gt=0, description="how long a completion waits for an inference worker to take it"
    )
    max_inference_seconds: float = Field(default=600.0, gt=0, description="longest one completion may run")
    inference_heartbeat_seconds: float = Field(
        default=2.0, gt=0, description="how often a worker marks the completions it runs as alive"
    )
    inference_lease_seconds: float = Field(
        default=10.0, gt=0, description="a completion whose worker was silent this long failed (503)"
    )
    max_completion_tokens: int = Field(
        default=2048, ge=1, description="tokens one completion may generate (max_tokens above it is a 400)"
    )
    export_stale_seconds: float = Field(
        default=900.0, gt=0, description="an export still preparing after this long is sent again"
    )

    # -- experiment trackers (a job's `integrations`; docs/INTERFACES.md) --
    # The worker sends HTTP requests to a job's MLflow tracking_uri: with this empty, a user can
    # make workers call any host they reach (internal services included). List the trackers'
    # hosts in production.
    allowed_tracker_hosts: str = Field(
        default="",
        description="comma-separated hosts (or host:port) a job's MLflow tracking_uri may name; "
        "empty = any host",
    )
    tracker_finish_seconds: float = Field(
        default=300.0,
        gt=0,
        description="how long a worker waits for a job's trackers to finish (model uploads included)",
    )

    @model_validator(mode="after")
    def _derive(self) -> Settings:
        # Resolved here (not in defaults) so an overridden data_dir moves every derived path.
        self.data_dir = self.data_dir.expanduser().resolve()
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'fromscratch.db'}"
        if not self.broker_url:
            self.broker_url = f"sqla+sqlite:///{self.data_dir / 'broker.db'}"
        self.database_url = _absolute_sqlite_url(self.database_url, Path.cwd())
        self.broker_url = _absolute_sqlite_url(self.broker_url, Path.cwd())
        self.blob_dir = (self.blob_dir or self.data_dir / "blobs").expanduser().resolve()
        if self.blob_backend is None:
            self.blob_backend = "fs" if self.is_sqlite else "db"
        if self.blob_backend == "s3" and not self.s3_bucket:
            raise ValueError("blob_backend=s3 needs s3_bucket (FROMSCRATCH_S3_BUCKET)")
        self.work_dir = (self.work_dir or self.data_dir / "work").expanduser().resolve()
        unknown = [q for q in self.queues if q not in WORKER_QUEUES]
        if unknown or not self.queues:
            raise ValueError(
                f"worker_queues={self.worker_queues!r}: use a comma-separated subset of {WORKER_QUEUES}"
            )
        if INFERENCE_QUEUE in self.queues and len(self.queues) > 1:
            raise ValueError(
                f"worker_queues={self.worker_queues!r}: the {INFERENCE_QUEUE!r} queue needs a worker of its "
                "own (a thread pool serving many requests; training workers run one job at a time)"
            )
        if self.inference_heartbeat_seconds >= self.inference_lease_seconds:
            raise ValueError(
                f"inference_heartbeat_seconds ({self.inference_heartbeat_seconds}) must be shorter than "
                f"inference_lease_seconds ({self.inference_lease_seconds})"
            )
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be shorter than lease_seconds "
                f"({self.lease_seconds}), or every lease would expire between heartbeats"
            )
        return self

    @property
    def work_path(self) -> Path:
        """`work_dir` as derived (`_derive` always sets it; the field is optional only as input)."""
        assert self.work_dir is not None
        return self.work_dir

    @property
    def queues(self) -> list[str]:
        return [q.strip() for q in self.worker_queues.split(",") if q.strip()]

    @property
    def tracker_hosts(self) -> list[str]:
        """`allowed_tracker_hosts` as lowercase entries (empty: any host)."""
        return [h.strip().lower() for h in self.allowed_tracker_hosts.split(",") if h.strip()]

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings from the environment (cached; tests build Settings(...) instead)."""
    return Settings()


def reset_settings() -> None:
    """Forget the cached settings (tests that change the environment)."""
    get_settings.cache_clear()
