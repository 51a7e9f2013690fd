"""figures.json from bench.json: zero 3's img/s over its zero 2 twin's, per backend and round
(the two rounds interleave the cells) and pooled. Run from the repository root."""
import json
from pathlib import Path

HERE = Path(__file__).parent
cells = json.loads((HERE / "bench.json").read_text())["cells"]
by = {(c["backend"], c["zero"]): c for c in cells}
figures = {}
for backend in ("torch", "tensorflow"):
    two, three = by[(backend, 2)], by[(backend, 3)]
    for n, (a, b) in enumerate(zip(three["images_per_sec_by_round"], two["images_per_sec_by_round"]), 1):
        figures[f"{backend}_round{n}_zero3_over_zero2"] = a / b
    figures[f"{backend}_pooled_zero3_over_zero2"] = (three["images_per_sec"]["median"]
                                                     / two["images_per_sec"]["median"])
(HERE / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
print(json.dumps(figures, indent=1))
