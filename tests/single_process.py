"""Run the smoke job as one plain process (no launcher), as a user's first try would."""
import json
import subprocess
import sys


def smoke_alone(backend: str, report_dir) -> dict:
    result = subprocess.run([sys.executable, "-m", "hvdcls", "smoke", "--backend", backend,
                             "--output-dir", str(report_dir)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads((report_dir / "rank-0.json").read_text())
