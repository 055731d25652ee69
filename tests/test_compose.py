"""Docker does not run here: check the production files by reading them."""

from pathlib import Path

import yaml

from core.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _env_vars(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return env


def test_compose_has_the_production_services() -> None:
    services = _compose()["services"]
    assert {"postgres", "redis", "migrate", "api", "worker"} <= set(services)
    assert services["migrate"]["command"] == ["fromscratch", "migrate"]
    assert services["worker"]["command"][:2] == ["fromscratch", "worker"]
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)
    for name in ("postgres", "redis", "api"):
        assert "healthcheck" in services[name], f"{name} has no healthcheck"


def test_every_fromscratch_variable_is_a_setting() -> None:
    fields = {name.upper() for name in Settings.model_fields}
    seen = set()
    for name, service in _compose()["services"].items():
        for var in _env_vars(service):
            if var.startswith("FROMSCRATCH_"):
                seen.add(var)
                assert var.removeprefix("FROMSCRATCH_") in fields, (
                    f"{name}: {var} is not read by core.settings"
                )
    assert {"FROMSCRATCH_DATABASE_URL", "FROMSCRATCH_BROKER_URL"} <= seen


def test_settings_read_the_compose_values(monkeypatch) -> None:
    env = _env_vars(_compose()["services"]["worker"])
    for var, value in env.items():
        monkeypatch.setenv(var, str(value))
    settings = Settings()
    assert settings.database_url.startswith("postgresql")
    assert settings.broker_url == "redis://redis:6379/0"
    assert settings.device == "cuda"


def test_dockerfile_installs_the_package_and_pins_torch() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert 'pip install "torch==2.13.0"' in text
    for part in ("trainer", "core", "api", "worker", "cli", "migrations"):
        assert f"COPY {part} ./{part}" in text
