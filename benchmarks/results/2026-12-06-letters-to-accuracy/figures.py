"""Figures derived from bench.json's runs, written to figures.json (docs/figures.yaml reads it).

hvdcls's median seconds to 0.9 over DDP's (issue 47's target: <= 1.0), and per runner the
median over its runs of the first evaluation's second since the launch and of an epoch after
it ((last evaluation - first) / (evaluations - 1)).
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def figures() -> dict:
    cells = {c["runner"]: c for c in json.loads((HERE / "bench.json").read_text())["cells"]}
    out: dict = {"hvdcls_over_ddp_seconds": cells["hvdcls"]["seconds"]["median"] / cells["ddp"]["seconds"]["median"]}
    for runner, cell in cells.items():
        curves = [run["curve"] for run in cell["run_results"]]
        out[runner] = {
            "first_evaluation_seconds": statistics.median(c[0][0] for c in curves),
            "epoch_seconds_after_it": statistics.median(
                (c[-1][0] - c[0][0]) / (len(c) - 1) for c in curves if len(c) > 1
            ),
        }
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
