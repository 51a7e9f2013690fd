"""Figures derived from the np=2 ResNet-50 zero benches (zero-default: glibc, zero-tcmalloc),
written to figures.json (docs/figures.yaml reads it): hvdcls's img/s median with tcmalloc over
glibc's, at zero 0 and zero 1 (two benches run one after the other, not one interleaved run).
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def img_s(arm: str, zero: int) -> float:
    cells = json.loads((HERE / arm / "bench.json").read_text())["cells"]
    (cell,) = [c for c in cells if c["runner"] == "hvdcls" and c["zero"] == zero]
    return float(cell["images_per_sec"]["median"])


def figures() -> dict:
    return {
        f"zero{z}_tcmalloc_over_glibc": img_s("zero-tcmalloc", z) / img_s("zero-default", z) for z in (0, 1)
    }


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
