"""figures.json from the bench.json files here: issue 50's efficiency (T=2's img/s over twice
one rank's at T=1) per size and round, the group's all-reduce share, and the paired one-core
runs over one alone (round 2's np=1, the clean one). Run from the repository root."""
import json
from pathlib import Path

HERE = Path(__file__).parent


def median(folder: str) -> float:
    cell = json.loads((HERE / folder / "bench.json").read_text())["cells"][0]
    return cell["images_per_sec"]["median"]


def share(folder: str) -> float:
    return json.loads((HERE / folder / "bench.json").read_text())["cells"][0]["tensor_parallel_share"]


figures = {}
for size, prefix in (("px32", ""), ("px64", "px64-"), ("tf_px64", "tf-px64-")):
    for n in (1, 2):
        run = f"{prefix}round{n}"
        figures[f"{size}_round{n}_efficiency"] = median(f"{run}/np2") / (2 * median(f"{run}/np1"))
        if not size.startswith("tf"):  # TensorFlow's sums run inside its compiled step: not timed apart
            figures[f"{size}_round{n}_tp_share_percent"] = 100 * share(f"{run}/np2")
alone = median("px64-round2/np1")
for core in (0, 1):
    figures[f"pair_core{core}_over_alone"] = median(f"px64-pair/core{core}") / alone
(HERE / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
print(json.dumps(figures, indent=1))
