"""Figures derived from utilisation.json, written to figures.json (docs/figures.yaml reads it for
docs/serve.md): the elastic variant's makespan over the fixed one's.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def figures() -> dict:
    results = json.loads((HERE / "utilisation.json").read_text())["results"]
    elastic, fixed = (results[name]["makespan_seconds"] for name in ("elastic", "fixed"))
    return {"elastic_over_fixed_makespan": elastic / fixed}


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
