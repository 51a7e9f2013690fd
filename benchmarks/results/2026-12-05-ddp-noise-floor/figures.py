"""Figures derived from the four logs (run.sh; each ends with every arm's img/s per round and
its ratio to the `ddp` arm), written to figures.json (docs/figures.yaml reads it).

Per log and arm: `vs_ddp` (the log's ratios, round by round) and its median; `vs_c5`, the arm's
img/s over the default cycle's (`c5`) in the same round, its median, and that median's
change in percent. Across logs:
`resnet50_5ms_vs_ddp`, hvdcls at 5 ms against DDP in every ResNet-50 round of the evening (c5
of both cycle runs, hvdcls of the DDP-against-DDP run), and the largest gap of the second DDP
arm from 1, in percent.
Run: python figures.py (it rewrites figures.json); tests/unit/test_doc_figures.py checks that
figures.json is what this computes.
"""
import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOGS = ("resnet50-cycle", "resnet50-cycle-2", "resnet18-cycle", "resnet50-ddp-against-ddp")
LINE = re.compile(r"^(\w+) \[([^\]]*)\] vs ddp per round \[([^\]]*)\]$", re.MULTILINE)


def numbers(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def figures() -> dict:
    out: dict = {}
    for log in LOGS:
        arms = {arm: (numbers(img_s), numbers(ratios)) for arm, img_s, ratios in LINE.findall(
            (HERE / f"{log}.log").read_text())}
        out[log] = {}
        for arm, (img_s, ratios) in arms.items():
            figs: dict = {"img_s_median": statistics.median(img_s), "vs_ddp": ratios,
                          "vs_ddp_median": statistics.median(ratios)}
            if "c5" in arms:
                figs["vs_c5"] = [a / b for a, b in zip(img_s, arms["c5"][0])]
                figs["vs_c5_median"] = statistics.median(figs["vs_c5"])
                figs["vs_c5_change_percent"] = (figs["vs_c5_median"] - 1) * 100
            out[log][arm] = figs
    rounds = (out["resnet50-cycle"]["c5"]["vs_ddp"] + out["resnet50-cycle-2"]["c5"]["vs_ddp"]
              + out["resnet50-ddp-against-ddp"]["hvdcls"]["vs_ddp"])
    out["resnet50_5ms_vs_ddp"] = {"rounds": len(rounds), "min": min(rounds), "max": max(rounds),
                                  "median": statistics.median(rounds)}
    again = out["resnet50-ddp-against-ddp"]["ddp_again"]["vs_ddp"]
    out["ddp_again_largest_gap_percent"] = max(abs(1 - r) for r in again) * 100
    return out


if __name__ == "__main__":
    (HERE / "figures.json").write_text(json.dumps(figures(), indent=1, sort_keys=True) + "\n")
