# One image for every service: api, worker, migrate.
# torch from PyPI on Linux x86_64 is the CUDA build (it brings the CUDA runtime as pip packages),
# so GPU workers only need the NVIDIA container toolkit on the host. A training worker uses every
# GPU its container is given (docker-compose.yml reserves all of a node's GPUs for one worker and
# sets FROMSCRATCH_WORKER_DEVICES to their count).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    FROMSCRATCH_DATA_DIR=/data

# g++ (gcc comes with it): torch.compile's C++ kernels on CPU, and the trainer's fused float32 CPU
# kernels (trainer/model/cpu_kernels.c, built on first use into ~/.cache; CPU training and inference use them)
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl g++ \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# Dependencies first so code changes do not rebuild the torch layer.
RUN pip install "torch==2.13.0"
COPY pyproject.toml README.md ./
COPY trainer ./trainer
COPY core ./core
COPY api ./api
COPY worker ./worker
COPY cli ./cli
COPY client ./client
COPY migrations ./migrations
# the `gpu` extra: Triton for the fused CUDA kernels (the CUDA torch wheel usually brings it too)
RUN pip install ".[gpu]"

RUN useradd --create-home --uid 1000 fromscratch && mkdir -p /data && chown fromscratch /data
USER fromscratch
VOLUME ["/data"]
EXPOSE 8000

# --http: request heads bounded (431), see api/http_server.py; `fromscratch serve` uses the same protocol
CMD ["uvicorn", "api.main:create_app", "--factory", "--host", "0.0.0.0", "--port", "8000", "--http", "api.http_server:BoundedHeadProtocol", "--timeout-graceful-shutdown", "5"]
