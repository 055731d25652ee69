"""trainer/ is a pure torch library: importing it (or running `fromscratch train`) must not load the
service stack, and `import trainer` alone must not even load torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = (
    "fastapi",
    "sqlalchemy",
    "celery",
    "api",
    "worker",
    "core",
    "starlette",
    "alembic",
    "redis",
    "kombu",
)

PROBE = """
import json, sys
{imports}
print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))
"""


def loaded_top_level_modules(imports: str) -> set[str]:
    r = subprocess.run(
        [sys.executable, "-c", PROBE.format(imports=imports)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def test_import_trainer_is_light():
    mods = loaded_top_level_modules("import trainer\nimport trainer.config")
    assert not mods & set(FORBIDDEN)
    assert "torch" not in mods


def test_trainer_modules_load_no_service_stack():
    mods = loaded_top_level_modules(
        "import trainer, trainer.run.loop, trainer.checkpoint, trainer.sampling, trainer.optim.optimizers, "
        "trainer.run.progress, trainer.cli, trainer.distributed.launch, trainer.export"
    )
    assert "torch" in mods
    assert not mods & set(FORBIDDEN), mods & set(FORBIDDEN)


def test_train_command_parser_loads_no_service_stack():
    mods = loaded_top_level_modules("from cli.main import build_parser\nbuild_parser(only='train')")
    assert not mods & set(FORBIDDEN), mods & set(FORBIDDEN)
