"""The one-schema rule: every field declared in trainer.config appears, with its default, in
`fromscratch train --help`, `fromscratch jobs create --help`, the JSON Schema served at
GET /v1/fine_tuning/hyperparameters and the dashboard's rendered new-job form — all derived from
the declarations, none kept by hand."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from cli.main import build_parser
from tests.dashboard.helpers import new_job_form_defaults
from tests.dashboard.test_dashboard_live import sign_in
from trainer.config import DEFAULT_PRESET, PRESETS, ModelConfig, TrainConfig, schema


def _help(monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    """An argparse help text on one line per option (no wrapping inside a default)."""
    monkeypatch.setenv("COLUMNS", "10000")
    parser = build_parser(only=argv[0])
    sub: Any = parser
    for name in argv:
        sub = next(a for a in sub._actions if a.__class__.__name__ == "_SubParsersAction").choices[name]
    return str(sub.format_help())


def _option_line(help_text: str, option: str) -> str:
    """The option's entry in a help text: its line plus the help argparse put on the next line."""
    lines = help_text.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(rf"\s+{re.escape(option)}\b", line)]
    assert starts, f"{option} missing"
    entry = [lines[starts[0]]]
    for line in lines[starts[0] + 1 :]:
        if not line.startswith(" " * 8) or line.lstrip().startswith("-"):
            break
        entry.append(line.strip())
    return " ".join(entry)


def _shown(value: Any) -> str:
    """A default as a help text shows it (a list comma-separated, as the option takes it)."""
    return schema.shown_value(value)


def test_every_config_field_is_in_the_clis_the_served_schema_and_the_form(
    monkeypatch: pytest.MonkeyPatch, new_page: Any, live_server: Any
) -> None:
    declared = schema.fields()
    names = [h.name for h in declared]
    # the declarations are the config classes' fields, nothing more or less
    assert set(names) == set(ModelConfig.model_fields) | set(TrainConfig.model_fields)

    train_help = _help(monkeypatch, "train")
    jobs_help = _help(monkeypatch, "jobs", "create")
    served = httpx.get(
        f"{live_server.url}/v1/fine_tuning/hyperparameters",
        headers={"Authorization": f"Bearer {live_server.api_key}"},
        timeout=30,
    ).json()
    page, log = new_page()
    sign_in(page, live_server.url, live_server.api_key)
    form = new_job_form_defaults(page)

    tiny = ModelConfig(**PRESETS[DEFAULT_PRESET])
    train_defaults = TrainConfig()
    for h in declared:
        expected = getattr(tiny if h.section == "model" else train_defaults, h.name)
        if h.in_cli:
            line = _option_line(train_help, h.option)
            shown = h.null_means if expected is None else _shown(expected)
            assert "default: " in line and str(shown) in line, (h.name, line)
        if not h.in_job:  # (the model's vocab_size is set by the tokenizer; its namesake is TrainConfig's)
            assert served["properties"].get(h.name, {}).get("x-section") != h.section, h.name
            continue
        line = _option_line(jobs_help, h.option)
        assert str(h.null_means if expected is None else _shown(expected)) in line, (h.name, line)
        prop = served["properties"][h.name]
        assert prop["default"] == expected and prop["description"] == h.help, (h.name, prop)
        assert prop["x-option"] == h.option
        # the form shows the default: a value, a checkbox state, or what an empty field means (a bool
        # unset by default, such as compile's auto, is a select: unset/on/off)
        displayed = form[h.name]
        if h.kind == "bool" and expected is not None:
            assert displayed is expected, (h.name, displayed)
        elif expected is None:
            assert displayed == h.null_means, (h.name, displayed)
        else:
            assert float(displayed) == expected if h.kind in ("int", "float") else displayed == expected, (
                h.name,
                displayed,
            )

    # and nothing else: every served property is a declared field (or OpenAI's multiplier), and an
    # option `--x-y` of `fromscratch jobs create`
    job_names = {h.name for h in schema.job_hyperparameters()}
    assert set(served["properties"]) == job_names
    assert set(form) == job_names
    for name, prop in served["properties"].items():
        assert _option_line(jobs_help, prop["x-option"])
        if name != schema.LEARNING_RATE_MULTIPLIER:  # OpenAI's alias scales learning_rate; API only
            assert _option_line(train_help, prop["x-option"])
    assert set(served["x-presets"]) == set(PRESETS)
    assert not log.errors()
