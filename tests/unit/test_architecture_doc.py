"""docs/architecture.md's tree names every module of hvdcls/, the backends and tools/: a new
file without its line there fails here.

The tree is read by its indentation: a line whose first word ends in `/` opens that folder
(inside the folder of the nearest line indented less), and every `NAME.py` or `NAME.sh` on a
line is a file of the folder the line belongs to (its own folder, for a folder's line).
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
TREES = ("hvdcls", "torch_backend", "tf_backend", "tools")
FILE = re.compile(r"[\w.-]+\.(?:py|sh)\b")


def tree_block(text: str) -> list[str]:
    """The lines of the first fenced block after the `## The tree` heading."""
    after = text.split("## The tree", 1)[1]
    return after.split("```", 2)[1].splitlines()


def named(lines: list[str]) -> set[str]:
    """Every file path the tree names, relative to the repository."""
    found, stack = set(), []  # stack: (indent, folder)
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        first = line.split()[0]
        if first.endswith("/"):
            stack.append((indent, f"{stack[-1][1]}/{first[:-1]}" if stack else first[:-1]))
        folder = stack[-1][1] if stack else ""
        found |= {f"{folder}/{name}" for name in FILE.findall(line)}
    return found


def modules() -> set[str]:
    return {str(path.relative_to(ROOT)) for tree in TREES for path in (ROOT / tree).rglob("*")
            if path.suffix in (".py", ".sh") and path.name != "__init__.py" and "__pycache__" not in path.parts}


def test_every_module_has_its_line_in_the_tree():
    missing = sorted(modules() - named(tree_block(DOC.read_text())))
    assert not missing, "docs/architecture.md's tree does not name: " + ", ".join(missing)


def test_the_reader_places_files_in_their_folders():
    lines = ["hvdcls/   the core", "  cli.py   the command", "  serve/   the service",
             "    executors/   what runs jobs", "      base.py  the contract; hosts.py beside it",
             "    app.py   the API", "tools/   setup.sh, docker_image.py:", "         gpu_check.sh (+ gpu_check.py)"]
    assert named(lines) == {"hvdcls/cli.py", "hvdcls/serve/executors/base.py", "hvdcls/serve/executors/hosts.py",
                            "hvdcls/serve/app.py", "tools/setup.sh", "tools/docker_image.py", "tools/gpu_check.sh",
                            "tools/gpu_check.py"}
