"""tools/setup.sh's refusals: one line, exit 2, and the command that fixes it."""
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What the script needs to reach its first check; mpirun, mpicxx and sudo stay out of PATH.
TOOLS = ("bash", "dirname", "date", "cat", "sha256sum", "cut", "rm", "touch")


def sandbox_path(tmp_path: Path, uid: int) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    fake_id = bin_dir / "id"
    fake_id.write_text(f"#!/bin/sh\necho {uid}\n")
    fake_id.chmod(0o755)
    return str(bin_dir)


def test_without_root_or_sudo_it_says_what_to_install(tmp_path):
    env = {"PATH": sandbox_path(tmp_path, uid=1000), "HOME": str(tmp_path)}
    result = subprocess.run([shutil.which("bash"), str(REPO / "tools" / "setup.sh")],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "openmpi-bin" in lines[0] and "libopenmpi-dev" in lines[0]
    assert "sudo apt-get install" in lines[0] and "no root" in lines[0]
