import subprocess
import sys

import pytest

from hvdcls import registry
from hvdcls.cli import main
from hvdcls.errors import UserError


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdcls", *args], capture_output=True, text=True)


def test_unknown_backend_is_one_line_exit_2():
    result = run_cli("smoke", "--backend", "mxnet")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "mxnet" in result.stderr and "Traceback" not in result.stderr


def test_unknown_command_is_one_line_exit_2():
    result = run_cli("trian")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1


def test_backend_choices_come_from_the_registry(capsys):
    assert main(["smoke", "--help"]) == 0
    out = capsys.readouterr().out
    for name in registry.names():
        assert name in out


def test_missing_framework_names_the_fix(monkeypatch):
    real_find_spec = registry.importlib.util.find_spec
    monkeypatch.setattr(registry.importlib.util, "find_spec",
                        lambda name: None if name == "torch" else real_find_spec(name))
    with pytest.raises(UserError, match=r"needs torch.*make setup"):
        registry.load("torch", "smoke")


def test_unknown_backend_lists_the_choices():
    with pytest.raises(UserError, match="torch, tensorflow"):
        registry.get("jax")
