"""The new-job form shows the trainer's defaults: api/static/js/defaults.js mirrors trainer.config."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from trainer.config import MODEL_FIELDS, PRESETS, ModelConfig, TrainConfig

DEFAULTS_JS = Path(__file__).resolve().parents[2] / "api" / "static" / "js" / "defaults.js"


def js_object(name: str) -> dict[str, Any]:
    text = DEFAULTS_JS.read_text()
    m = re.search(rf"export const {name} = (\{{.*?\}});\n", text, re.S)
    assert m, f"{name} not found in {DEFAULTS_JS}"
    return json.loads(m.group(1))


def test_train_defaults_match_train_config() -> None:
    expected = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name != "extra"}
    assert js_object("TRAIN_DEFAULTS") == expected


def test_model_defaults_and_presets_match() -> None:
    expected = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name in MODEL_FIELDS}
    assert js_object("MODEL_DEFAULTS") == expected
    assert js_object("PRESETS") == PRESETS
