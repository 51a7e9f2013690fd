"""Figures derived from the benches here, written to figures.json (docs/figures.yaml reads it):
the outside CPU over the cells of the benches docs/benchmarks.md's table quotes (in percent, the
loopback bench's DDP cells apart), and DDP's best PowerSGD img/s at 100 Mbit/s over the three
benches at that link (before, after, with float16 factors) with hvdcls's float16 factors over it;
at 1 Gbit/s, hvdcls's PowerSGD (float16 factors) img/s over its uncompressed and its fp16 cells';
from skinny.txt, how many times slower M @ Q ran than (Q^T M^T)^T per shape, and the range.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE = ("loopback-after", "link-100-after", "link-100-fp16-factors", "link-1000")
LINK_100 = ("link-100-before", "link-100-after", "link-100-fp16-factors")


def cells(bench: str) -> list:
    return json.loads((HERE / bench / "bench.json").read_text())["cells"]


def figures() -> dict:
    quiet, loopback_ddp = [], []
    for bench in TABLE:
        for c in cells(bench):
            share = c["outside_cpu_share"] * 100
            (loopback_ddp if bench == "loopback-after" and c["runner"] == "ddp" else quiet).append(share)
    ddp_best = max(c["images_per_sec"]["median"] for b in LINK_100 for c in cells(b) if c["runner"] == "ddp")
    (fp16,) = [c for c in cells("link-100-fp16-factors") if c["runner"] == "hvdcls"]
    timings = re.findall(r"M @ Q ([0-9.]+) ms, \(Q\^T M\^T\)\^T ([0-9.]+) ms", (HERE / "skinny.txt").read_text())
    skinny = [float(tall) / float(wide) for tall, wide in timings]
    link_1000 = {c["compression"]: c["images_per_sec"]["median"] for c in cells("link-1000") if c["runner"] == "hvdcls"}
    return {
        "link_1000_powersgd_over": {k: link_1000["powersgd"] / link_1000[k] for k in ("none", "fp16")},
        "skinny_times_slower": {"min": min(skinny), "max": max(skinny)},
        "outside_cpu_percent": {"min": min(quiet), "max": max(quiet)},
        "outside_cpu_percent_loopback_ddp": {"min": min(loopback_ddp), "max": max(loopback_ddp)},
        "link_100_ddp_best_img_s": ddp_best,
        "link_100_fp16_factors_over_ddp_best": fp16["images_per_sec"]["median"] / ddp_best,
    }


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
