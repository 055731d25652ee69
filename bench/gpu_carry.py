"""What a lent GPU box needs for bench/gpu_check.py, prepared on this machine: the box reaches no
network, brings its own CUDA build of torch (and Triton), and lacks the service's packages and
llama-cpp-python (the GGUF consumer test failed there twice for want of it). This writes, in the
repository's root (both ignored by git: .git/info/exclude):

- `.whl/`: wheels for the box's Python (3.12 by default) of pyproject's dependencies but torch, of
  what the CUDA tests import (pytest, pytest-timeout), and of llama-cpp-python, built here from its
  source for a portable CPU (no -march=native);
- `.nanogpt/`: a copy of a nanoGPT checkout (`--nanogpt PATH`);

then prints the device call, which unpacks the wheels beside the box's own packages and runs
gpu_check within the tool's 10 minutes:

    .venv/bin/python bench/gpu_carry.py --nanogpt PATH --build-python /path/to/python3.12
    .venv/bin/python bench/gpu_carry.py --dry-run      # the requirements and commands, nothing run

Downloading takes a minute; building llama-cpp-python several on two cores (its progress shown).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEELS, NANOGPT = ".whl", ".nanogpt"
# What the boxes lent so far had (2026-11-23/26/27: H100 and H200, torch 2.11.0+cu130, Python 3.12),
# and weigh most: torch and Triton with torch's sympy and networkx, and what our trainer, the ONNX
# export and the transformers and onnxruntime consumer tests ran on there. Resolved, never carried:
# the device tool carries 64 MiB at most. Small packages whose version matters (typing-extensions:
# anyio needs a recent one) are carried even where the box has them: the carried copy comes first.
BOX_BRINGS = {
    "torch", "triton", "sympy", "mpmath", "networkx", "numpy", "transformers", "huggingface-hub", "hf-xet",
    "tokenizers", "onnx", "onnxscript", "onnx-ir", "ml-dtypes", "protobuf", "onnxruntime",
}  # fmt: skip
NOT_USED = {"boto3"}  # the s3 blob backend's alone (imported with it): the check runs the embedded store
CARRY_LIMIT = 64 << 20  # the device tool's bytes for all carried paths together
TEST_EXTRA_NEEDED = ("pytest", "pytest-timeout")  # `pytest -m cuda` on the box
BUILT = "llama-cpp-python"  # no wheel on PyPI: built here, alone (its requirements downloaded)
BUILT_NEEDS = ("typing-extensions>=4.5", "numpy>=1.20", "diskcache>=5.6.1", "jinja2>=2.11.3")
PORTABLE = "-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def requirement_name(requirement: str) -> str:
    """A requirement's distribution name, lower case ("uvicorn[standard]>=0.54" -> "uvicorn")."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return match.group(1).lower().replace("_", "-")


def carried_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """pyproject's dependencies but what the box brings, and the test extra's entries the CUDA
    tests need, as pyproject states them (one place for the versions)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    base = [r for r in project["dependencies"] if requirement_name(r) not in BOX_BRINGS | NOT_USED]
    test = project["optional-dependencies"]["test"]
    wanted = {*TEST_EXTRA_NEEDED, BUILT}
    return base + [r for r in test if requirement_name(r) in wanted]


def download_command(requirements: list[str], python_version: str, dest: Path) -> list[str]:
    """pip download of every requirement but the built one, and the built one's own requirements,
    with what they pull in, as wheels for the box's Python on x86-64 Linux: one resolution, so one
    version of each (the wheels are installed together, without resolving again)."""
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--implementation", "cp"]
    cmd += ["--python-version", python_version, "--dest", str(dest)]
    cmd += [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    return cmd + [r for r in requirements if requirement_name(r) != BUILT] + list(BUILT_NEEDS)


def build_command(requirements: list[str], build_python: str, dest: Path) -> list[str]:
    """pip wheel of llama-cpp-python alone, by a Python of the box's version."""
    built = next(r for r in requirements if requirement_name(r) == BUILT)
    return [
        build_python,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--progress-bar",
        "on",
        "--wheel-dir",
        str(dest),
        built,
    ]


def device_command(minutes: float) -> str:
    """The one device call: the carried wheels unpacked beside the box's packages (as the sessions
    of 2026-11-26/27 did), then the check, its clock set to leave the install a minute."""
    return (
        f"python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site {WHEELS}/*.whl && "
        f"PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout {round(minutes * 60) + 15} "
        f"python3 bench/gpu_check.py --minutes {minutes:g} --nanogpt {NANOGPT} --out $OUT"
    )


def wheel_name(path: Path) -> str:
    """The distribution a wheel file holds ("hf_xet-1.8.0-cp38-....whl" -> "hf-xet")."""
    return requirement_name(path.name.split("-")[0])


def drop_what_the_box_brings(dest: Path) -> int:
    """Deletes the wheels of BOX_BRINGS (resolved with the rest, so their requirements came too);
    returns the bytes left."""
    for wheel in dest.glob("*.whl"):
        if wheel_name(wheel) in BOX_BRINGS:
            wheel.unlink()
    return sum(w.stat().st_size for w in dest.glob("*.whl"))


def run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("$", shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout, copied to .nanogpt/")
    ap.add_argument("--python-version", default="3.12", help="the box's Python (3.12 on the boxes so far)")
    ap.add_argument("--build-python", default="python3.12", help="a Python of that version, to build with")
    ap.add_argument("--minutes", type=float, default=8.75, help="gpu_check's --minutes in the command")
    ap.add_argument("--dry-run", action="store_true", help="print the requirements and commands only")
    args = ap.parse_args(argv)
    requirements = carried_requirements()
    dest = REPO / WHEELS
    commands = [
        download_command(requirements, args.python_version, dest),
        build_command(requirements, args.build_python, dest),
    ]
    print("carried:", ", ".join(requirements))
    if args.dry_run:
        for cmd in commands:
            print("$", shlex.join(cmd))
    else:
        dest.mkdir(exist_ok=True)
        run(commands[0])
        run(commands[1], env={**os.environ, "CMAKE_ARGS": PORTABLE})
        size = drop_what_the_box_brings(dest)
        print(f"{WHEELS}: {len(list(dest.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB")
        if size > CARRY_LIMIT:
            raise SystemExit(f"more than the device tool carries ({CARRY_LIMIT >> 20} MiB): drop some")
        if args.nanogpt is not None:
            shutil.copytree(
                args.nanogpt, REPO / NANOGPT, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git")
            )
        exclude = REPO / ".git" / "info" / "exclude"
        lines = exclude.read_text().splitlines() if exclude.exists() else []
        missing = [f"/{name}/" for name in (WHEELS, NANOGPT) if f"/{name}/" not in lines]
        if missing and exclude.parent.is_dir():
            exclude.write_text("".join(f"{line}\n" for line in [*lines, *missing]))
    print(f"device call (carry {WHEELS} and {NANOGPT}):\n{device_command(args.minutes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
