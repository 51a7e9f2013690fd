"""The tree's architecture, stated once: which package may import which, and no cycles.

Read from the source with `ast` (nothing is imported), so the rule holds for imports inside
functions too, and for a module loaded by name: `importlib.import_module("hvdcls.x")` (or
`import_module(".x", __package__)`) with a literal name is an import like any other. A name the
code computes (the registry's backends, the service's executors) is not followed. Imports under
`if TYPE_CHECKING:` never run, so they may name a layer above (a type a contract mentions); but
they still tie two modules together, so they count when looking for cycles.

docs/architecture.md's layer table is checked against ALLOWED, row for row: a failure prints the
rows the table should have.
"""
import ast
import functools
import importlib.util
import re
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hvdcls", "torch_backend", "tf_backend")
CORE = "hvdcls"  # the modules at hvdcls/'s top level: contract, config, errors, registry, ...
CORE_PACKAGES = {"hvdcls.config", "hvdcls.launching", "hvdcls.files", "hvdcls.maths"}  # part of the core, grouped by concern

# Each layer may import these layers (and itself). The command (cli) is in the core and obeys its
# rule, but loads each subcommand by name (importlib) when it runs: those loads, and only those,
# may reach any layer (they still count for cycles).
ENTRY_POINTS = {"hvdcls.cli"}
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


def package_of(module: str, path: Path) -> str:
    """What `__package__` is inside `module` (a package's own __init__ is its package)."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def loaded_by_name(node: ast.Call, package: str) -> Optional[str]:
    """The module `importlib.import_module("NAME"[, package])` or `import_module(...)` loads,
    when NAME is written as a literal string (and a relative one's package as a literal or
    `__package__`); None otherwise."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called != "import_module" or not node.args:
        return None
    if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id == "importlib"):
        return None
    name = node.args[0]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return None
    if not name.value.startswith("."):
        return name.value
    given = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "package"), None)
    if isinstance(given, ast.Constant) and isinstance(given.value, str):
        package = given.value
    elif not (isinstance(given, ast.Name) and given.id == "__package__"):
        return None
    return importlib.util.resolve_name(name.value, package)


def imported(path: Path, known: set[str], type_checking: bool = False, by_name: bool = True,
             module: Optional[str] = None) -> set[str]:
    """The project modules `path` imports (a `from pkg import name` naming a module counts; a
    relative import is resolved against `module`, by default the one `path` is); with
    `type_checking`, those under `if TYPE_CHECKING:` too; with `by_name`, those loaded through
    `import_module` with a literal name."""
    found: set[str] = set()
    if module is None and path.is_relative_to(ROOT):
        module = module_name(path)
    package = package_of(module, path) if module else ""

    def ours(name: str) -> bool:
        return name.split(".")[0] in PACKAGES

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if ours(a.name))
        elif isinstance(node, ast.ImportFrom) and (node.level == 0 or package):
            base = node.module or ""
            if node.level:
                base = importlib.util.resolve_name("." * node.level + base, package)
            if ours(base):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.add(full if full in known else base)
        elif isinstance(node, ast.Call) and by_name:
            target = loaded_by_name(node, package)
            if target and ours(target):
                found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(parsed(path))
    return found


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    """Each file parsed once for both graphs."""
    return ast.parse(path.read_text(), str(path))


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """The imports that run, for the layer rule (the entry point's loads by name left out)."""
    known = modules()
    return {name: imported(path, set(known), by_name=name not in ENTRY_POINTS) - {name}
            for name, path in known.items()}


@pytest.fixture(scope="module")
def typed_graph() -> dict[str, set[str]]:
    """The imports that run, those made by name and those only a type checker reads."""
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


def test_a_module_loaded_by_name_is_an_import(tmp_path):
    """importlib.import_module with a literal name, absolute or relative, is followed; a computed
    name is not; the entry point's loads are seen for cycles but left out of the layer rule."""
    source = tmp_path / "arguments.py"
    source.write_text("import importlib\nfrom importlib import import_module\n"
                      "handler = lambda a: importlib.import_module('hvdcls.sweep.command').run(a)\n"
                      "def f():\n    import_module('.driver', __package__)\n"
                      "    importlib.import_module('..serve.client', package='hvdcls.sweep')\n"
                      "    importlib.import_module(f'hvdcls.{name}')\n    importlib.import_module('json')\n"
                      "from . import space\n")
    known = {"hvdcls.sweep.command", "hvdcls.sweep.driver", "hvdcls.serve.client", "hvdcls.sweep.space"}
    assert imported(source, known, module="hvdcls.sweep.arguments") == known
    assert imported(source, known, by_name=False, module="hvdcls.sweep.arguments") == {"hvdcls.sweep.space"}
    assert set(modules()) >= ENTRY_POINTS


def test_what_describes_a_job_reaches_into_no_executor(typed_graph):
    """The spec, the service's settings and Slurm's options are read by the service, the client
    and every executor; none of them imports a module of hvdcls.serve.executors."""
    for module in ("hvdcls.serve.spec", "hvdcls.serve.settings", "hvdcls.serve.slurm_options"):
        reached = sorted(t for t in typed_graph[module] if t.startswith("hvdcls.serve.executors"))
        assert not reached, f"{module} imports {', '.join(reached)}"


def layer_table(text: str) -> dict[str, set[str]]:
    """docs/architecture.md's layer table as ALLOWED's shape: each row's packages (first column,
    in backticks) -> the packages it may import (second column; `nothing else of ours`: none)."""
    section = text.split("## The layer rule", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue  # prose, the header, the rule under it
        for package in re.findall(r"`([\w.]+)`", cells[0]):
            table[package] = set(re.findall(r"`([\w.]+)`", cells[1]))
    return table


def table_row(package: str) -> str:
    allowed = sorted(ALLOWED[package], key=lambda p: (p != CORE, p))
    return f"| `{package}` | {', '.join(f'`{p}`' for p in allowed) or 'nothing else of ours'} | ... |"


def test_the_documented_layer_table_is_the_rule():
    """The table in docs/architecture.md says what ALLOWED says, row for row."""
    table = layer_table((ROOT / "docs" / "architecture.md").read_text())
    wrong = sorted(p for p in set(ALLOWED) | set(table) if table.get(p) != ALLOWED.get(p))
    assert not wrong, "docs/architecture.md's layer table disagrees with ALLOWED; its rows should read:\n" + \
        "\n".join(table_row(p) if p in ALLOWED else f"(no row for `{p}`: not a layer)" for p in wrong)


def test_the_table_reader():
    text = ("## The layer rule\n\n| package | may import | why |\n| --- | --- | --- |\n"
            "| `hvdcls` (top modules) | nothing else of ours | shared |\n"
            "| `a`, `b` | `hvdcls`, `hvdcls.data` | x |\n\n## Next\n| `c` | `hvdcls` | y |\n")
    assert layer_table(text) == {"hvdcls": set(), "a": {"hvdcls", "hvdcls.data"}, "b": {"hvdcls", "hvdcls.data"}}
