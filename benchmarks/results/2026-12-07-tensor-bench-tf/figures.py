"""figures.json from the two runs' bench.json (run from this directory): TensorFlow's activation
bytes at T=1 with the GELU that ships over those with the composed GELU, for ViT-B/16 and
ViT-L/16 (the same ratio to two decimals, which docs/benchmarks.md quotes); and from
gelu_speed.txt the shipped GELU's speed over the composed one's, the median of the pairs'."""
import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).parent


def tf_t1_activations(directory: Path) -> float:
    cells = json.loads((directory / "bench.json").read_text())["cells"]
    return next(c["activation_bytes"] for c in cells if c["backend"] == "tensorflow" and c["tensor"] == 1)


def figures() -> dict:
    ratios = [tf_t1_activations(HERE / model) / tf_t1_activations(HERE / "composed-gelu" / model)
              for model in ("vit_b_16", "vit_l_16")]
    assert round(ratios[0], 2) == round(ratios[1], 2), ratios
    return {"tf_t1_activations_vs_composed_gelu": ratios[0],
            "tf_t1_activations_vs_composed_gelu_vit_l_16": ratios[1], **gelu_speed()}


def gelu_speed() -> dict:
    """Each round's composed step time over its shipped one (speed, shipped against composed)."""
    text = (HERE / "gelu_speed.txt").read_text()
    shipped = [float(ms) for ms in re.findall(r"^shipped: step (\d+) ms", text, re.MULTILINE)]
    composed = [float(ms) for ms in re.findall(r"^composed: step (\d+) ms", text, re.MULTILINE)]
    ratios = [c / s for s, c in zip(shipped, composed, strict=True)]
    return {"gelu_speed_pairs": len(ratios), "gelu_speed_median": statistics.median(ratios),
            "gelu_speed_min": min(ratios), "gelu_speed_max": max(ratios)}


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1) + "\n")
