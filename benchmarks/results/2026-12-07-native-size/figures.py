"""figures.json from the bench.json files run.sh leaves here (docs/figures.yaml reads it): per
backend and round, zero 3's img/s over zero 2's (ViT-B/16) and T=2's over twice one rank's at
T=1 (ViT-L/16), with the tensor group's all-reduce share (torch's; TensorFlow's sums run inside
its compiled step). Run: python figures.py (it rewrites figures.json);
tests/unit/test_doc_figures.py checks that figures.json is what this computes.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def cells(folder: str) -> list[dict]:
    return json.loads((HERE / folder / "bench.json").read_text())["cells"]


def rate(cell: dict) -> float:
    return cell["images_per_sec"]["median"]


def figures() -> dict:
    out = {}
    for backend in ("torch", "tensorflow"):
        for n in (1, 2):
            by_zero = {c["zero"]: c for c in cells(f"zero-{backend}-round{n}")}
            out[f"{backend}_round{n}_zero2_img_s"] = rate(by_zero[2])
            out[f"{backend}_round{n}_zero3_img_s"] = rate(by_zero[3])
            out[f"{backend}_round{n}_zero3_over_zero2"] = rate(by_zero[3]) / rate(by_zero[2])
            one, two = cells(f"tensor-{backend}-round{n}/np1")[0], cells(f"tensor-{backend}-round{n}/np2")[0]
            out[f"{backend}_round{n}_t1_img_s"] = rate(one)
            out[f"{backend}_round{n}_t2_img_s"] = rate(two)
            out[f"{backend}_round{n}_efficiency"] = rate(two) / (2 * rate(one))
            if backend == "torch":
                out[f"{backend}_round{n}_tp_share_percent"] = 100 * two["tensor_parallel_share"]
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
