"""Figures derived from bench.json (with hvdcls-horovodrun), written to figures.json (docs/figures.yaml
reads it): the same figures as the quiet run's, computed by its figures.py over this run's
bench.json. Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py
checks that figures.json is what this computes.
"""
import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUIET = HERE.parent / "2026-12-04-to-accuracy-quiet" / "figures.py"
_spec = importlib.util.spec_from_file_location("quiet_figures", QUIET)
assert _spec is not None and _spec.loader is not None
_quiet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_quiet)


def figures() -> dict:
    return _quiet.figures(HERE)


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
