"""Figures derived from t1/summary-table.json (the letters, default lr=auto against a rate grid,
each run's final validation accuracy), written to figures.json (docs/figures.yaml reads it):
per backend, the best grid rate's final accuracy less the default's.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def figures() -> dict:
    runs = {r["run"]: r for r in json.loads((HERE / "t1" / "summary-table.json").read_text())}
    out = {}
    for backend in ("torch", "tensorflow"):
        grid = [r["final"] for name, r in runs.items() if name.startswith(f"{backend}-lr")]
        out[f"{backend}_best_grid_less_default"] = max(grid) - runs[f"{backend}-auto"]["final"]
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
