"""The version is stated once, in hvdcls/__init__.py; setup.py reads it from there."""
import subprocess
import sys
from pathlib import Path

import hvdcls

REPO = Path(__file__).resolve().parents[2]


def test_setup_py_reads_the_package_version():
    result = subprocess.run([sys.executable, "setup.py", "--version"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == hvdcls.__version__
    assert "0.1.0" not in (REPO / "setup.py").read_text()
