"""Figures derived from the raw files here, written to figures.json (docs/figures.yaml reads it):
from the np=2 ResNet-50 zero benches (zero-default: glibc, zero-tcmalloc), hvdcls's img/s median
with tcmalloc over glibc's, at zero 0 and zero 1 (two benches run one after the other, not one
interleaved run), and rank 0's peak RSS (MB) with its ratio; from step.txt, each allocator's
step (ms) by round and glibc's over tcmalloc's; from acc/ (the digits to 0.9 at a global batch of
32), hvdcls's median seconds over DDP's at np=2 x 16.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent


def img_s(arm: str, zero: int) -> float:
    cells = json.loads((HERE / arm / "bench.json").read_text())["cells"]
    (cell,) = [c for c in cells if c["runner"] == "hvdcls" and c["zero"] == zero]
    return float(cell["images_per_sec"]["median"])


def peak_rss_mb(arm: str, zero: int) -> float:
    cells = json.loads((HERE / arm / "bench.json").read_text())["cells"]
    (cell,) = [c for c in cells if c["runner"] == "hvdcls" and c["zero"] == zero]
    return float(cell["memory"]["peak_rss_bytes"]) / 1e6


def figures() -> dict:
    out: dict = {
        f"zero{z}_tcmalloc_over_glibc": img_s("zero-tcmalloc", z) / img_s("zero-default", z) for z in (0, 1)
    }
    for z in (0, 1):
        glibc, tc = peak_rss_mb("zero-default", z), peak_rss_mb("zero-tcmalloc", z)
        out[f"zero{z}_peak_rss_mb"] = {"glibc": glibc, "tcmalloc": tc, "tcmalloc_over_glibc": tc / glibc}
    steps: dict = {}
    for arm, ms in re.findall(r"^(\w+) median ms ([0-9.]+)$", (HERE / "step.txt").read_text(), re.MULTILINE):
        steps.setdefault(arm, []).append(float(ms))
    out["step_ms"] = steps
    out["step_glibc_over_tcmalloc"] = [g / t for g, t in zip(steps["default"], steps["tcmalloc"])]
    acc = json.loads((HERE / "acc" / "bench.json").read_text())["cells"]
    seconds = {(c["runner"], c["np"]): c["seconds"]["median"] for c in acc}
    out["acc_np2_hvdcls_over_ddp_seconds"] = seconds["hvdcls", 2] / seconds["ddp", 2]
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
