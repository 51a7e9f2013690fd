"""The loader measured alone (benchmarks/input_pipeline.py): its repetitions summed up per cell,
the ratios to the peers, the issue's targets and the markdown table. No framework here.

A repetition is one pipeline reading one photo size with one transform for a fixed number of
batches after its warm-up, and gives two rates per core:
- `per_worker`: images per second divided by the loader's workers (DataLoader processes,
  tf.data parallel calls, DALI threads), the rate of one busy core when the workers keep the
  cores busy and the process taking the batches does little;
- `per_cpu_second`: images per CPU-second spent by the pipeline's process and its live worker
  processes over the same batches, which other work on the machine changes less.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Optional


@dataclass(frozen=True)
class Target:
    size: str
    transform: str
    pipeline: str
    peer: str
    at_least: float

    def label(self) -> str:
        return f"{self.size} {self.transform}: {self.pipeline} >= {self.at_least:g}x {self.peer}"


# issue 47 item 1
TARGETS = (Target("imagenet", "train", "hvdcls-torch", "torchvision", 2.0),
           Target("imagenet", "train", "hvdcls-tf", "tf.data", 1.0),
           Target("12mp", "train", "hvdcls-torch", "torchvision", 5.0))
RATES = ("per_worker", "per_cpu_second")


def rates(images: int, seconds: float, cpu_seconds: float, workers: int) -> dict[str, float]:
    """One repetition's rates (see the module's docstring)."""
    return {"images_per_sec": images / seconds, "per_worker": images / seconds / max(1, workers),
            "per_cpu_second": images / cpu_seconds if cpu_seconds > 0 else float("nan")}


def summarise(reps: Iterable[dict]) -> dict[tuple[str, str, str], dict]:
    """(size, transform, pipeline) -> the median, min and max of each rate over its repetitions."""
    grouped: dict[tuple[str, str, str], list[dict]] = {}
    for rep in reps:
        grouped.setdefault((rep["size"], rep["transform"], rep["pipeline"]), []).append(rep)
    cells = {}
    for key, group in grouped.items():
        cell: dict = {"reps": len(group)}
        for rate in ("images_per_sec", *RATES):
            values = [rep[rate] for rep in group]
            cell[rate] = statistics.median(values)
            cell[f"{rate}_range"] = [min(values), max(values)]
        cells[key] = cell
    return cells


def ratio(cells: dict, size: str, transform: str, pipeline: str, peer: str,
          rate: str = "per_worker") -> Optional[float]:
    """`pipeline`'s median rate over `peer`'s in the same cell; None when either is missing."""
    mine, theirs = cells.get((size, transform, pipeline)), cells.get((size, transform, peer))
    if not mine or not theirs or not theirs[rate]:
        return None
    return mine[rate] / theirs[rate]


def verdicts(cells: dict, targets: Iterable[Target] = TARGETS) -> list[dict]:
    """Each target with the ratio on both rates; met only when both reach it."""
    out = []
    for target in targets:
        found = {rate: ratio(cells, target.size, target.transform, target.pipeline, target.peer, rate)
                 for rate in RATES}
        measured = [value for value in found.values() if value is not None]
        met = None if len(measured) < len(RATES) else all(value >= target.at_least for value in measured)
        out.append({"target": target.label(), **found, "met": met})
    return out


def markdown(cells: dict, sizes: list[str], transforms: list[str], pipelines: list[str]) -> str:
    """One row per size and transform: each pipeline's img/s per worker (and per CPU-second),
    then hvdcls's ratios to the peers of its backend."""
    head = ["size", "transform", *pipelines, "hvdcls-torch / torchvision", "hvdcls-tf / tf.data"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for size in sizes:
        for transform in transforms:
            row = [size, transform]
            for pipeline in pipelines:
                cell = cells.get((size, transform, pipeline))
                row.append(f"{cell['per_worker']:.1f} ({cell['per_cpu_second']:.1f})" if cell else "-")
            for mine, peer in (("hvdcls-torch", "torchvision"), ("hvdcls-tf", "tf.data")):
                pair = [ratio(cells, size, transform, mine, peer, rate) for rate in RATES]
                row.append("-" if None in pair else f"{pair[0]:.2f}x ({pair[1]:.2f}x)")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def verdict_lines(found: list[dict]) -> str:
    marks = {True: "met", False: "not met", None: "not measured"}
    lines = []
    for item in found:
        shown = ", ".join(f"{item[rate]:.2f}x {rate.replace('_', ' ')}" for rate in RATES if item[rate] is not None)
        lines.append(f"- {item['target']}: {marks[item['met']]}" + (f" ({shown})" if shown else ""))
    return "\n".join(lines) + "\n"
