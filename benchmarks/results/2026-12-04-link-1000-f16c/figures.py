"""Figures derived from bench.json (1 Gbit/s, the wheel with F16C float16 sums), written to
figures.json (docs/figures.yaml reads it): hvdcls's img/s with fp16 compression over its img/s
uncompressed.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def figures() -> dict:
    cells = json.loads((HERE / "bench.json").read_text())["cells"]
    img_s = {c["compression"]: c["images_per_sec"]["median"] for c in cells if c["runner"] == "hvdcls"}
    return {"hvdcls_fp16_over_none": img_s["fp16"] / img_s["none"]}


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
