"""figures.json from the profiles and thread readings kept here (docs/figures.yaml reads it):
per step on rank 0 (torch's profiler over 2 steps; its self times sum to the step) T=1's and
T=2's seconds, the efficiency, the matrix products' and the group's sums' seconds, and each
thread's share of a T=2 rank's perf samples. Run: python figures.py (it rewrites figures.json);
tests/unit/test_doc_figures.py checks that figures.json is what this computes.
"""
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 2  # training.profile_steps
PRODUCTS = ("aten::mm", "aten::addmm")
SUMS = ("_SumOverGroup", "_CopyToGroupBackward")


def self_seconds(name: str) -> dict[str, tuple[float, float]]:
    """Per op of a torch_ops.txt table: (self CPU %, self CPU seconds)."""
    rows = {}
    for line in (HERE / "profiles" / name).read_text().splitlines():
        m = re.match(r"\s*(\S.*?)\s{2,}([\d.]+)%\s+([\d.]+)(ms|s|us)\s", line)
        if m:
            scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[m.group(4)]
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)) * scale)
    return rows


def per_step(name: str) -> dict[str, float]:
    rows = self_seconds(name)
    percent, seconds = rows["aten::mm"]
    step = seconds / (percent / 100) / STEPS  # the table's total self time, a step
    products = sum(rows[op][1] for op in PRODUCTS) / STEPS
    sums = sum(rows[op][1] for op in SUMS if op in rows) / STEPS
    return {"step": step, "products": products, "sums": sums, "rest": step - products - sums}


def thread_shares() -> list[float]:
    text = (HERE / "profiles" / "perf-threads-t2-gloo.txt").read_text()
    return [float(x) for x in re.findall(r"^\s+([\d.]+)%\s+\d+:python", text, re.M)]


def figures() -> dict:
    one, gloo, mpi = (per_step(f) for f in ("t1-np1-taskset.txt", "t2-np2-gloo.txt", "t2-np2-mpirun.txt"))
    out = {f"{run}_{key}_seconds": value for run, d in (("t1", one), ("t2_gloo", gloo), ("t2_mpirun", mpi))
           for key, value in d.items()}
    out["t2_gloo_efficiency"] = one["step"] / (2 * gloo["step"])
    out["t2_mpirun_efficiency"] = one["step"] / (2 * mpi["step"])
    out["t2_gloo_products_over_t1"] = gloo["products"] / one["products"]
    out["t2_gloo_sums_percent"] = 100 * gloo["sums"] / gloo["step"]
    main, transport, background = thread_shares()[:3]
    out.update(main_thread_percent=main, gloo_transport_thread_percent=transport,
               horovod_background_thread_percent=background)
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
