"""Figures derived from bench.json's runs, written to figures.json (docs/figures.yaml reads it).

Per cell (`RUNNER-npN-bB`): the median over its runs of the first evaluation's second (since the
launch) and of an epoch after it ((last evaluation - first) / (evaluations - 1)); per np and
batch (`npN-bB`), hvdcls's median seconds over DDP's.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def figures() -> dict:
    out: dict = {}
    cells = json.loads((HERE / "bench.json").read_text())["cells"]
    seconds = {(c["runner"], c["np"], c["batch_size"]): c["seconds"]["median"] for c in cells}
    for runner, np_, batch in seconds:
        if runner == "hvdcls" and ("ddp", np_, batch) in seconds:
            out[f"np{np_}-b{batch}"] = {
                "hvdcls_over_ddp_seconds": seconds[runner, np_, batch] / seconds["ddp", np_, batch]
            }
    for cell in cells:
        curves = [run["curve"] for run in cell["run_results"]]
        out[f"{cell['runner']}-np{cell['np']}-b{cell['batch_size']}"] = {
            "first_evaluation_seconds": statistics.median(c[0][0] for c in curves),
            "epoch_seconds_after_it": statistics.median(
                (c[-1][0] - c[0][0]) / (len(c) - 1) for c in curves if len(c) > 1
            ),
        }
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
