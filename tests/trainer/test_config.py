"""trainer.config's declarations: bounds and cross-field rules reach every entry point."""

from __future__ import annotations

import pytest

from cli.main import main
from trainer.config import ConfigError, TrainConfig


def test_devices_defaults_to_one_and_is_bounded(capsys, tmp_path):
    assert TrainConfig().devices == 1 and TrainConfig().sharding == "ddp"
    assert TrainConfig(devices=64).devices == 64
    with pytest.raises(ConfigError) as err:
        TrainConfig(devices=65)
    assert err.value.problems == [("devices", "must be <= 64, got 65")]
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(tmp_path / "data.txt"), "--out", str(tmp_path / "o"), "--devices", "65"])
    assert exit_.value.code == 2
    assert "--devices: must be <= 64, got 65" in capsys.readouterr().err


def test_lbfgs_trains_in_one_process():
    with pytest.raises(ConfigError) as err:
        TrainConfig(devices=2, optimizer="lbfgs")
    assert err.value.param == "devices" and "L-BFGS" in str(err.value)


def test_lbfgs_gets_its_own_learning_rate_unless_one_is_given():
    """L-BFGS at AdamW's 1e-3 learned nothing (its rate is the line search's first step)."""
    assert TrainConfig(optimizer="lbfgs").learning_rate == 1.0
    assert TrainConfig(optimizer="lbfgs", learning_rate=0.3).learning_rate == 0.3
    assert TrainConfig().learning_rate == TrainConfig(optimizer="muon").learning_rate == 1e-3
    resumed = TrainConfig.from_dict(TrainConfig(optimizer="lbfgs").to_dict())  # kept as stored
    assert resumed.learning_rate == 1.0 and resumed.resolved_min_lr == 0.1


@pytest.mark.parametrize(
    ("values", "field", "fragment"),
    [
        ({"max_steps": 10**12}, "max_steps", "<= 10000000"),
        ({"batch_size": 2**63}, "batch_size", "<= 4096"),
        ({"keep_checkpoints": 10**9}, "keep_checkpoints", "<= 1000"),
        ({"learning_rate": float("nan")}, "learning_rate", "finite"),
        ({"max_steps": 5.5}, "max_steps", "integer"),
        ({"compile": "yes"}, "compile", "true or false"),
        ({"extra_knob": 1}, "extra_knob", "unknown"),
    ],
)
def test_every_numeric_field_is_bounded_and_strictly_typed(values, field, fragment):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**values)
    assert err.value.param == field and fragment in str(err.value)


def test_an_integral_float_is_an_integer_and_every_problem_is_reported_at_once():
    assert TrainConfig(max_steps=20.0).max_steps == 20
    with pytest.raises(ConfigError) as err:
        TrainConfig(max_steps=0, schedule="zigzag", min_lr=1.0)
    assert {name for name, _ in err.value.problems} == {"max_steps", "schedule"}


def test_train_config_is_its_groups_flat_and_in_their_order():
    """TrainConfig's fields are exactly those of TRAIN_GROUPS' classes, each in one group, and every
    derived surface lists them group by group: the schema's fields, the JSON Schema (x-group) and
    the sections of `fromscratch train --help`."""
    from trainer.config import schema
    from trainer.config.train import TRAIN_GROUPS, group_of

    declared = [name for group in TRAIN_GROUPS.values() for name in group.model_fields]
    assert sorted(declared) == sorted(TrainConfig.model_fields)
    assert len(declared) == len(set(declared))
    order = list(TRAIN_GROUPS)
    train_fields = [h for h in schema.fields() if h.section == "train"]
    ranks = [order.index(h.group) for h in train_fields]
    assert ranks == sorted(ranks) and {h.group for h in train_fields} == set(order)
    assert all(h.group == group_of(h.name) for h in train_fields)
    properties = schema.json_schema()["properties"]
    assert properties["beta1"]["x-group"] == "optimizer" and properties["n_layer"]["x-group"] == "model"
    in_json = [order.index(p["x-group"]) for p in properties.values() if p.get("x-section") == "train"]
    assert in_json == sorted(in_json)


def test_train_help_has_a_section_per_group(capsys):
    from trainer.config.train import TRAIN_GROUPS

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    positions = [out.index(f"\n{name}:\n") for name in TRAIN_GROUPS]
    assert positions == sorted(positions)
    runtime = out[out.index("\nruntime:\n") :]
    assert "--devices" in runtime and "--beta1" not in runtime
