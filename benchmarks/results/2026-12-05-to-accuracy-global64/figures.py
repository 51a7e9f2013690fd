"""Figures derived from bench.json's runs, written to figures.json (docs/figures.yaml reads it).

Per cell (`RUNNER-npN-bB`): the median over its runs of the first evaluation's second (since the
launch) and of an epoch after it ((last evaluation - first) / (evaluations - 1)); per np and
batch (`npN-bB`), hvdcls's median seconds over DDP's; hvdcls's start-up per cell (the median of
seconds less summary.json's seconds_to_target); and issue 26's second target at a global batch of
64: np=2 x 32's seconds over one process x 64's plus the difference of their start-ups, with
DDP's lead to its first evaluation and its epoch at np=2 x 32.
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
    for cell in cells:
        if cell["runner"] == "hvdcls":
            out[f"hvdcls-np{cell['np']}-b{cell['batch_size']}"]["startup_seconds"] = statistics.median(
                run["seconds"] - run["summary_seconds_to_target"] for run in cell["run_results"]
            )
    one, two, ddp = out["hvdcls-np1-b64"], out["hvdcls-np2-b32"], out["ddp-np2-b32"]
    startup_gap = two["startup_seconds"] - one["startup_seconds"]
    out["global64"] = {
        "startup_gap_seconds": startup_gap,
        "np2_over_np1_plus_startup": seconds["hvdcls", 2, 32] / (seconds["hvdcls", 1, 64] + startup_gap),
        "first_evaluation_lead_over_ddp": ddp["first_evaluation_seconds"] - two["first_evaluation_seconds"],
        "epoch_slower_than_ddp": two["epoch_seconds_after_it"] - ddp["epoch_seconds_after_it"],
        "np2_slower_than_ddp_seconds": seconds["hvdcls", 2, 32] - seconds["ddp", 2, 32],
    }
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
