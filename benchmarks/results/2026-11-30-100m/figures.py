"""Figures derived from bench.json (np=2 across a 100 Mbit/s link), written to figures.json
(docs/figures.yaml reads it): hvdcls's img/s with each compression over its img/s uncompressed.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def figures() -> dict:
    cells = json.loads((HERE / "bench.json").read_text())["cells"]
    img_s = {c["compression"]: c["images_per_sec"]["median"] for c in cells if c["runner"] == "hvdcls"}
    return {f"hvdcls_{name}_over_none": rate / img_s["none"] for name, rate in img_s.items() if name != "none"}


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
