"""Docker does not run here: check the production files by reading them. Values are interpolated
the way compose does (`${VAR:-default}` from the environment given, else the default;
`${VAR:?message}` refuses to start without VAR)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from core.device_queues import consumed_queues
from core.settings import QUEUES, Settings

ROOT = Path(__file__).resolve().parents[1]
_VAR = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")
SECRETS = {"POSTGRES_PASSWORD": "pg-pw", "S3_SECRET_KEY": "s3-secret"}  # what an operator must set


class Unset(Exception):
    """A `${VAR:?message}` without VAR: compose refuses to start."""


def _value(m: re.Match[str], env: dict[str, str]) -> str:
    name, kind, text = m.group(1), m.group(2), m.group(3) or ""
    if env.get(name):
        return env[name]
    if kind == "?":
        raise Unset(f"{name}: {text}")
    return text


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """compose's `${VAR}` / `${VAR:-default}` / `${VAR:?message}` in every string of `value`."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: _value(m, env), value)
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    return value


def _compose(env: dict[str, str] | None = None, file: str = "docker-compose.yml") -> dict[str, Any]:
    """The file as compose reads it, with SECRETS set unless `env` says otherwise."""
    return interpolate(yaml.safe_load((ROOT / file).read_text()), {**SECRETS, **(env or {})})


def _env_vars(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _settings(service: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The Settings a service's process would read from its environment."""
    for var in list(os.environ):
        if var.startswith("FROMSCRATCH_"):
            monkeypatch.delenv(var)
    for var, value in _env_vars(service).items():
        monkeypatch.setenv(var, value)
    return Settings()


def _gpu_workers(services: dict[str, Any]) -> dict[str, Any]:
    """The services running a training worker of the gpu queue."""
    return {
        name: s
        for name, s in services.items()
        if s.get("command", [])[:2] == ["fromscratch", "worker"]
        and "gpu" in _env_vars(s).get("FROMSCRATCH_WORKER_QUEUES", "").split(",")
    }


def test_compose_has_the_production_services() -> None:
    services = _compose()["services"]
    assert {"postgres", "redis", "seaweedfs", "migrate", "api", "worker", "inference-worker"} <= set(services)
    assert services["migrate"]["command"] == ["fromscratch", "migrate"]
    assert services["worker"]["command"][:2] == ["fromscratch", "worker"]
    assert services["inference-worker"]["command"] == ["fromscratch", "worker", "--queues", "inference"]
    for name in ("postgres", "redis", "seaweedfs", "api"):
        assert "healthcheck" in services[name], f"{name} has no healthcheck"


def _flags(command: list[str]) -> dict[str, str]:
    """`-name=value` arguments of a command (a bare `-name` is "true")."""
    flags = [arg.lstrip("-").partition("=") for arg in command if arg.startswith("-")]
    return {name: value if sep else "true" for name, sep, value in flags}


@pytest.mark.parametrize("keys", [{}, {"S3_ACCESS_KEY": "ops", "S3_SECRET_KEY": "k3y"}])
def test_the_services_keep_their_blobs_in_seaweedfs(
    keys: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    compose = _compose(keys)
    services = compose["services"]
    seaweedfs = services["seaweedfs"]
    assert seaweedfs["command"][0] == "server" and seaweedfs["image"].startswith("chrislusf/seaweedfs:")
    flags = _flags(seaweedfs["command"])
    assert flags["s3"] == "true" and flags["filer"] == "true" and flags["master.telemetry"] == "false"
    assert any(v.endswith(":/data") for v in seaweedfs["volumes"]) and flags["dir"] == "/data"
    assert flags["s3.port"] in seaweedfs["healthcheck"]["test"][-1]
    # its one S3 identity (the config file compose writes) is the credentials the services sign with
    [config] = [c for c in seaweedfs["configs"] if c["target"] == flags["s3.config"]]
    identity = json.loads(compose["configs"][config["source"]]["content"])["identities"][0]
    assert {"Read", "Write", "List"} <= set(identity["actions"])
    [credentials] = identity["credentials"]
    assert credentials["accessKey"] == keys.get("S3_ACCESS_KEY", "fromscratch")
    for name in ("migrate", "api", "worker", "inference-worker"):
        service = services[name]
        settings = _settings(service, monkeypatch)
        assert settings.blob_backend == "s3" and settings.s3_bucket, name
        endpoint = urlsplit(settings.s3_endpoint_url)
        assert (endpoint.hostname, str(endpoint.port)) == ("seaweedfs", flags["s3.port"]), name
        env = _env_vars(service)
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (
            credentials["accessKey"],
            credentials["secretKey"],
        ), name
        assert env.get("AWS_REGION"), name
        # started once SeaweedFS answers (migrate creates the bucket before anything else runs)
        assert service["depends_on"]["seaweedfs"]["condition"] == "service_healthy", name
        if name != "migrate":
            assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert not _settings(services["api"], monkeypatch).s3_presigned_downloads  # streams unless asked
    opted_in = _compose(
        {"S3_PRESIGNED_DOWNLOADS": "true", "S3_PUBLIC_ENDPOINT_URL": "https://s3.example.org"}
    )
    api = _settings(opted_in["services"]["api"], monkeypatch)
    assert api.s3_presigned_downloads and api.s3_public_endpoint_url == "https://s3.example.org"


@pytest.mark.parametrize("gpus", [None, "8"])
def test_each_gpu_worker_reserves_its_gpus_and_says_how_many(
    gpus: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"GPUS_PER_NODE": gpus} if gpus else {}
    services = _compose(env)["services"]
    workers = _gpu_workers(services)
    assert workers, "no gpu worker in docker-compose.yml"
    api = _settings(services["api"], monkeypatch)
    for name, service in workers.items():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        gpu = [d for d in devices if "gpu" in d["capabilities"]]
        assert len(gpu) == 1 and gpu[0]["driver"] == "nvidia", name
        count = int(gpu[0]["count"])  # a number: "all" would hide how many the worker advertises
        assert count == int(gpus or 1), name
        settings = _settings(service, monkeypatch)
        # the worker runs jobs on exactly the GPUs it reserves, and the API admits up to that many
        assert settings.worker_devices == count and settings.device == "cuda", name
        assert api.gpu_worker_devices == count, "FROMSCRATCH_GPU_WORKER_DEVICES differs from the workers"
        # its command's queues are the setting's, and it consumes every routed gpu queue up to count
        assert service["command"][2:] == ["--queues", settings.worker_queues], name
        assert consumed_queues(settings.queues, count)[0] == ("gpu" if count == 1 else f"gpu.{count}")
        shm = re.fullmatch(r"(\d+)gb", str(service.get("shm_size", "")))
        assert shm and int(shm.group(1)) >= 1, f"{name}: NCCL needs more than Docker's 64 MB /dev/shm"


def test_every_fromscratch_variable_is_a_setting() -> None:
    fields = {name.upper() for name in Settings.model_fields}
    seen: dict[str, set[str]] = {}
    for name, service in _compose()["services"].items():
        for var in _env_vars(service):
            if var.startswith("FROMSCRATCH_"):
                seen.setdefault(name, set()).add(var)
                assert var.removeprefix("FROMSCRATCH_") in fields, (
                    f"{name}: {var} is not read by core.settings"
                )
    needed = {"FROMSCRATCH_DATABASE_URL", "FROMSCRATCH_BROKER_URL"}
    for name in ("migrate", "api", "worker", "inference-worker"):
        assert needed <= seen[name], name
    assert {"FROMSCRATCH_GPU_WORKER_DEVICES", "FROMSCRATCH_GPU_WORKER_MEMORY_BYTES"} <= seen["api"]
    assert {"FROMSCRATCH_WORKER_QUEUES", "FROMSCRATCH_WORKER_DEVICES", "FROMSCRATCH_DEVICE"} <= seen["worker"]


def test_settings_read_the_compose_values(monkeypatch: pytest.MonkeyPatch) -> None:
    services = _compose({"POSTGRES_PASSWORD": "s3cret"})["services"]
    for name in ("api", "worker", "inference-worker", "migrate"):
        settings = _settings(services[name], monkeypatch)
        assert settings.database_url == "postgresql+psycopg://fromscratch:s3cret@postgres:5432/fromscratch"
        assert settings.broker_url == "redis://redis:6379/0"
        assert settings.default_queue in QUEUES
    assert _settings(services["worker"], monkeypatch).device == "cuda"
    assert _settings(services["inference-worker"], monkeypatch).queues == ["inference"]


def test_dockerfile_installs_the_package_and_pins_torch() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert 'pip install "torch==2.13.0"' in text
    # every package the console script may import (pyproject's list: `keys list` imports client/)
    packages = re.search(r"packages.find\]\ninclude = (\[.*\])", (ROOT / "pyproject.toml").read_text())
    assert packages is not None
    for part in json.loads(packages.group(1)):
        assert f"COPY {part.rstrip('*')} ./{part.rstrip('*')}" in text, part
    # compose's services run the image's console script and uvicorn; no FROMSCRATCH_* the
    # Dockerfile sets may be a name Settings does not read
    fields = {name.upper() for name in Settings.model_fields}
    for var in re.findall(r"\b(FROMSCRATCH_\w+)=", text):
        assert var.removeprefix("FROMSCRATCH_") in fields, var


def test_every_api_server_bounds_request_heads() -> None:
    """The Dockerfile, compose and `fromscratch serve` serve the API with the same bounded protocol
    (api/http_server.py: a huge header is a 431, not seconds of buffering)."""
    from api.http_server import GRACEFUL_SHUTDOWN_SECONDS, PROTOCOL, BoundedHeadProtocol

    [cmd_line] = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")]
    dockerfile_cmd = json.loads(cmd_line.removeprefix("CMD "))
    compose_cmd = _compose()["services"]["api"]["command"]
    assert dockerfile_cmd == compose_cmd
    assert compose_cmd[compose_cmd.index("--http") + 1] == PROTOCOL
    # an open event stream must not hold a SIGTERM'd API up until its job ends
    grace = compose_cmd[compose_cmd.index("--timeout-graceful-shutdown") + 1]
    assert int(grace) == GRACEFUL_SHUTDOWN_SECONDS
    module, _, name = PROTOCOL.partition(":")
    assert getattr(__import__(module, fromlist=[name]), name) is BoundedHeadProtocol
    from cli.main import build_parser
    from cli.serve import uvicorn_config

    args = build_parser(only="serve").parse_args(["serve", "--port", "8123"])
    assert uvicorn_config(args).http is BoundedHeadProtocol
    assert uvicorn_config(args).timeout_graceful_shutdown == GRACEFUL_SHUTDOWN_SECONDS


def test_the_secrets_are_required() -> None:
    """No default password or S3 secret: compose refuses to start without them, naming them."""
    for name in SECRETS:
        with pytest.raises(Unset, match=name):
            _compose({name: ""})


def test_a_node_file_runs_the_same_worker_against_the_first_nodes_services(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docker-compose.node.yml: the main file's training worker, its URLs the first node's (published
    there on PUBLISH_HOST), with no services of its own to start."""
    main = _compose({"GPUS_PER_NODE": "8"})
    node = _compose({"GPUS_PER_NODE": "8", "MAIN_HOST": "10.0.0.5"}, "docker-compose.node.yml")
    assert list(node["services"]) == ["worker"] and "depends_on" not in node["services"]["worker"]
    with pytest.raises(Unset, match="MAIN_HOST"):
        _compose({}, "docker-compose.node.yml")
    here, there = main["services"]["worker"], node["services"]["worker"]
    for key in ("image", "command", "shm_size", "deploy", "stop_grace_period"):
        assert here[key] == there[key], key
    mine, theirs = _settings(here, monkeypatch), _settings(there, monkeypatch)
    assert mine.database_url.replace("@postgres:", "@10.0.0.5:") == theirs.database_url
    assert mine.broker_url.replace("//redis:", "//10.0.0.5:") == theirs.broker_url
    assert mine.s3_endpoint_url.replace("//seaweedfs:", "//10.0.0.5:") == theirs.s3_endpoint_url
    same = ("blob_backend", "s3_bucket", "s3_prefix", "queues", "device", "worker_devices", "default_queue")
    assert all(getattr(mine, f) == getattr(theirs, f) for f in same)
    assert _env_vars(here)["AWS_SECRET_ACCESS_KEY"] == _env_vars(there)["AWS_SECRET_ACCESS_KEY"]
    # the first node publishes what the workers of others need, on the address the operator gives
    published = {s: main["services"][s]["ports"] for s in ("postgres", "redis", "seaweedfs")}
    assert published == {
        "postgres": ["127.0.0.1:5432:5432"],
        "redis": ["127.0.0.1:6379:6379"],
        "seaweedfs": ["127.0.0.1:8333:8333"],
    }
    private = _compose({"PUBLISH_HOST": "10.0.0.5"})["services"]["redis"]["ports"]
    assert private == ["10.0.0.5:6379:6379"]
