"""Figures derived from bench.json (on the quiet machine, with horovodrun), written to figures.json (docs/figures.yaml
reads it): for torch at np=2, per global batch (`gGLOBAL`), hvdcls's median seconds over DDP's
and hvdcls's start-up (the median of each run's seconds less summary.json's seconds_to_target).
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def figures(here: Path = HERE) -> dict:
    """From `here`'s bench.json (the launcher run's figures.py reuses this on its own)."""
    cells = [
        c for c in json.loads((here / "bench.json").read_text())["cells"]
        if c["backend"] == "torch" and c["np"] == 2
    ]
    ddp = {c["global_batch"]: c["seconds"]["median"] for c in cells if c["runner"] == "ddp"}
    out = {}
    for c in cells:
        if c["runner"] == "hvdcls":
            out[f"g{c['global_batch']}"] = {
                "hvdcls_over_ddp_seconds": c["seconds"]["median"] / ddp[c["global_batch"]],
                "startup_seconds": statistics.median(
                    run["seconds"] - run["summary_seconds_to_target"] for run in c["run_results"]
                ),
            }
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
