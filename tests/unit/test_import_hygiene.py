"""The core must not import a framework or a Horovod binding (STYLE.md, rule 1)."""
import json
import pkgutil
import subprocess
import sys

import hvdcls

FORBIDDEN = ("torch", "tensorflow", "keras", "horovod")


def modules_loaded_after(code: str) -> set[str]:
    probe = code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def frameworks_in(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in FORBIDDEN}


def test_help_imports_no_framework():
    code = ("from hvdcls.cli import main\n"
            "for argv in (['--help'], ['train', '--help'], ['data', 'pack', '--help'],\n"
            "             ['doctor', '--help'], ['smoke', '--help'], ['demo', '--help'],\n"
            "             ['timeline', '--help'], ['report', '--help']):\n"
            "    assert main(argv) == 0, argv\n"
            "import hvdcls.cli_doc; hvdcls.cli_doc.markdown()\n")  # docs/cli.md: every command's parser
    assert frameworks_in(modules_loaded_after(code)) == set()


def test_every_core_module_imports_no_framework():
    names = [m.name for m in pkgutil.walk_packages(hvdcls.__path__, "hvdcls.") if m.name != "hvdcls.__main__"]
    assert {"hvdcls.checks.doctor", "hvdcls.checks.smoke", "hvdcls.training.run", "hvdcls.training.loop",
            "hvdcls.observe.report", "hvdcls.observe.prometheus", "hvdcls.observe.tensorboard",
            "hvdcls.observe.timeline", "hvdcls.bench.worker", "hvdcls.data.sources"} <= set(names)
    code = "import importlib\n" + "".join(f"importlib.import_module({n!r})\n" for n in names)
    assert frameworks_in(modules_loaded_after(code)) == set()


def test_probe_detects_a_framework_import():
    """Guard against a probe that cannot fail: importing a backend must show up."""
    assert "torch" in frameworks_in(modules_loaded_after("import torch_backend.smoke"))
