"""trainer/'s architecture as its folders state it (trainer/__init__.py): imports point down the layers,
no import cycle exists (function-level imports included), and every module imports alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "trainer"

# Bottom to top; a module may import its own layer and the ones below. The longest prefix decides.
LAYERS: list[tuple[str, ...]] = [
    ("trainer.config",),
    ("trainer.model",),
    ("trainer.data",),
    ("trainer.optim", "trainer.checkpoint", "trainer.checkpoint_snapshot"),
    ("trainer.run",),
    ("trainer.distributed", "trainer.export", "trainer.sampling", "trainer.logprobs"),
    ("trainer.cli", "trainer"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(TRAINER.rglob("*.py"))}


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), rank)
    assert best is not None, f"{module} is in no layer of {LAYERS}"
    return best[1]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import of a module, at any depth, except those only a type checker runs."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def trainer_imports(module: str) -> set[str]:
    """The trainer modules `module` imports (a `from pkg import name` naming a module counts as it)."""
    tree = ast.parse(MODULES[module].read_text())
    targets: set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        targets.update(name for name in names if name in MODULES)
    targets.discard(module)
    return targets


GRAPH = {module: trainer_imports(module) for module in MODULES}


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in GRAPH.items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "\n".join(upward)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_no_import_cycle_in_trainer() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    """The checker itself: a function-level import that closes a loop is a cycle; one under
    TYPE_CHECKING is not."""
    a = ast.parse("def f():\n    import b\n")
    b = ast.parse("if TYPE_CHECKING:\n    import c\nimport a\n")
    nodes = {name: _import_nodes(tree) for name, tree in {"a": a, "b": b}.items()}
    graph = {name: {alias.name for n in found for alias in n.names} for name, found in nodes.items()}
    assert graph == {"a": {"b"}, "b": {"a"}}
    assert find_cycle(graph) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


IMPORT_EACH_ALONE = """
import os, sys
import numpy, pydantic, torch  # third-party start-up paid once; the trainer's modules load per child
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            __import__(name)
        except BaseException as err:
            print(f"{name}: {type(err).__name__}: {err}", file=sys.stderr)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failed.append(name)
print("failed:", " ".join(failed))
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_every_trainer_module_imports_alone() -> None:
    """Each module first in a fresh interpreter (a forked child with no trainer module loaded): a
    cycle that only bites in one import order shows here."""
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH_ALONE, *sorted(MODULES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
