"""The client is its own package: importing it (or building the `files|jobs|models` commands) loads
neither the server (api/) nor torch; and the server itself loads no torch. Each probe runs in a
fresh interpreter so modules other tests imported do not leak in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
{imports}
print(json.dumps(sorted(sys.modules)))
"""


def loaded_modules(imports: str) -> set[str]:
    r = subprocess.run(
        [sys.executable, "-c", PROBE.format(imports=imports)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def server_modules(modules: set[str]) -> set[str]:
    return {m for m in modules if m == "api" or m.startswith("api.")}


def test_client_package_loads_neither_the_server_nor_torch() -> None:
    mods = loaded_modules(
        "import client, client.http, client.commands, client.hyperparameter_options\n"
        "from client.commands import follow, files, jobs, models, output, registration, runner"
    )
    assert "client.commands.registration" in mods  # the probe did import what it names
    assert "torch" not in mods
    assert not server_modules(mods), server_modules(mods)


def test_client_commands_parser_loads_neither_the_server_nor_torch() -> None:
    mods = loaded_modules(
        "from cli.main import build_parser\n"
        "parser = build_parser(only='jobs')\n"
        "parser.parse_args(['jobs', 'create', '--file', 'file-1', '--max-steps', '5'])"
    )
    assert "torch" not in mods
    assert not server_modules(mods), server_modules(mods)


def test_server_app_loads_no_torch() -> None:
    mods = loaded_modules("import api.main")
    assert "api.main" in mods
    assert "torch" not in mods
