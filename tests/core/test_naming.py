from types import SimpleNamespace

from core.naming import checkpoint_model_id, final_model_id, parse_model_id


def test_model_ids() -> None:
    job = SimpleNamespace(id="ftjob-abc123", model="llama-tiny", suffix=None)
    assert final_model_id(job) == "ft:llama-tiny:abc123"
    assert checkpoint_model_id(job, 40) == "ft:llama-tiny:abc123:ckpt-step-40"

    child = SimpleNamespace(id="ftjob-def456", model="ft:llama-tiny:abc123", suffix="poems")
    assert final_model_id(child) == "ft:llama-tiny:poems:def456"  # the root preset is kept

    parsed = parse_model_id("ft:llama-tiny:poems:def456:ckpt-step-7")
    assert parsed is not None
    assert (parsed.root, parsed.suffix, parsed.job_id, parsed.step) == (
        "llama-tiny",
        "poems",
        "ftjob-def456",
        7,
    )
    assert parse_model_id("ft:llama-tiny:abc123").step is None
    for bad in ("llama-tiny", "ft:x", "ft:a:b:c:d", "ft:a:b:ckpt-step-x", "gpt:a:b"):
        assert parse_model_id(bad) is None, bad
