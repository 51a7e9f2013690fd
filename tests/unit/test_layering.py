"""The tree's architecture, stated once: which package may import which, and no cycles.

Read from the source with `ast` (nothing is imported), so the rule holds for imports inside
functions too. Imports under `if TYPE_CHECKING:` never run, so they may name a layer above (a
type a contract mentions); but they still tie two modules together, so they count when looking
for cycles.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hvdcls", "torch_backend", "tf_backend")
CORE = "hvdcls"  # the modules at hvdcls/'s top level: contract, config, errors, registry, ...
CORE_PACKAGES = {"hvdcls.config"}  # packages that are part of the core (one concern, split in files)

# Each layer may import these layers (and itself). Entry points (cli, __main__) reach the
# rest through importlib by name, so they obey the core's rule like any other top module.
ALLOWED = {
    CORE: set(),
    "hvdcls.data": {CORE},
    "hvdcls.observe": {CORE},
    "hvdcls.checks": {CORE},
    "hvdcls.training": {CORE, "hvdcls.data", "hvdcls.observe"},
    # training.balance's planner; observe's timeline reader (the step anatomy's report)
    "hvdcls.bench": {CORE, "hvdcls.data", "hvdcls.training", "hvdcls.observe"},
    # evaluate, export, predict: a run's checkpoint and config (training), its data, its plots
    "hvdcls.inference": {CORE, "hvdcls.data", "hvdcls.training", "hvdcls.observe"},
    # The service launches `hvdcls train` as processes: it never imports training or a framework.
    "hvdcls.serve": {CORE},
    # The sweep's space is read against the config; its trials go through the service's client,
    # its metrics are the epoch records' (observe), and its parent run reuses the tracker's settings.
    "hvdcls.sweep": {CORE, "hvdcls.serve", "hvdcls.observe"},
    # Backends implement the contract over the data's batches; never the loop nor the bench.
    "torch_backend": {CORE, "hvdcls.data", "hvdcls.checks", "hvdcls.inference"},
    "tf_backend": {CORE, "hvdcls.data", "hvdcls.checks", "hvdcls.inference"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def layer(module: str) -> str:
    """hvdcls.data.sources -> hvdcls.data; hvdcls.config -> hvdcls; tf_backend.x -> tf_backend."""
    parts = module.split(".")
    if parts[0] != "hvdcls":
        return parts[0]
    candidate = ".".join(parts[:2])
    return candidate if candidate in ALLOWED else CORE


def is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imported(path: Path, known: set[str], type_checking: bool = False) -> set[str]:
    """The project modules `path` imports (a `from pkg import name` naming a module counts);
    with `type_checking`, those under `if TYPE_CHECKING:` too."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in PACKAGES)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in PACKAGES:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(path, set(known)) - {name} for name, path in known.items()}


@pytest.fixture(scope="module")
def typed_graph() -> dict[str, set[str]]:
    """The imports that run and those only a type checker reads."""
    known = modules()
    return {name: imported(path, set(known), type_checking=True) - {name} for name, path in known.items()}


def test_every_package_is_placed_in_a_layer():
    """A package directly under hvdcls/ has a row; one inside it (hvdcls.serve.executors)
    belongs to its parent's layer."""
    for name in modules():
        if name.startswith("hvdcls.") and name.count(".") == 1 and (ROOT / name.replace(".", "/")).is_dir():
            assert name in ALLOWED or name in CORE_PACKAGES, f"new package {name}: give it a row in ALLOWED"


def test_imports_point_down_the_layers(graph):
    broken = [f"{source} imports {target}"
              for source, targets in graph.items() for target in targets
              if layer(target) != layer(source) and layer(target) not in ALLOWED[layer(source)]]
    assert not broken, "\n".join(sorted(broken))


def test_no_import_cycles(typed_graph):
    graph = typed_graph
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        if node in path:
            cycle = path[path.index(node):] + [node]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            walk(target, path + [node])
        done.add(node)

    for module in sorted(graph):
        walk(module, [])


def test_the_rule_catches_an_upward_import(tmp_path):
    """The checker itself: a backend importing the loop is reported."""
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from hvdcls.training.loop import Trainer\n")
    targets = imported(source, {"hvdcls.training.loop"})
    assert targets == {"hvdcls.training.loop"}
    assert layer("hvdcls.training.loop") not in ALLOWED["torch_backend"]


def test_an_import_only_a_type_checker_reads_still_counts_for_cycles(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hvdcls.serve import service\n")
    assert imported(source, {"hvdcls.serve.service"}) == set()  # never runs: no layer broken
    assert imported(source, {"hvdcls.serve.service"}, type_checking=True) == {"hvdcls.serve.service"}
