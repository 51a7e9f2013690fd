"""Time to a target accuracy, from a run's per-epoch records: the arithmetic of `hvdcls bench
--to-accuracy`, kept free of launches, files and frameworks so that it is tested on its own.

A run's records are its metrics.jsonl lines (hvdcls.observe.monitor.EpochRecord as dicts), in
epoch order; each carries `wall_time`, rank 0's Unix time once that epoch's evaluation ended.
Seconds to target count from `launched`, the Unix time just before the ranks were launched, to
the end of the first epoch whose validation accuracy reaches the target: the ranks' start-up,
every epoch's training and every evaluation up to it are inside.
"""
from __future__ import annotations

import statistics
from typing import Optional


def run_result(records: list[dict], target: float, launched: float) -> dict:
    """One run: whether it converged and, if so, seconds, epochs and training images to the
    target; its best accuracy, how many epochs it ran, and its curve [[seconds, accuracy], ...]."""
    curve = [[r["wall_time"] - launched, r["val_accuracy"]] for r in records]
    hit = next((i for i, r in enumerate(records) if r["val_accuracy"] >= target), None)
    reached = {"seconds": None, "epochs": None, "images": None} if hit is None else {
        "seconds": curve[hit][0], "epochs": records[hit]["epoch"],
        "images": sum(r["train_images"] for r in records[:hit + 1])}
    return {"converged": hit is not None, **reached,
            "best_accuracy": max((r["val_accuracy"] for r in records), default=None),
            "epochs_run": len(records), "curve": curve}


def spread(values: list[float]) -> Optional[dict]:
    """median, min, max; None when there is nothing to summarise."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# More non-converging runs than this marks a cell: its figures rest on a lucky minority.
MAX_MISSES = 1


def cell_summary(runs: list[dict]) -> dict:
    """A cell's runs (run_result's) together: seconds, epochs and images over the runs that
    converged, the best accuracy over all, the count of each, and the mark."""
    hits = [r for r in runs if r["converged"]]
    misses = len(runs) - len(hits)
    return {"runs": len(runs), "converged_runs": len(hits), "converged": bool(runs) and not misses,
            "marked": misses > MAX_MISSES,
            "seconds": spread([r["seconds"] for r in hits]),
            "epochs": spread([r["epochs"] for r in hits]),
            "images": spread([r["images"] for r in hits]),
            "best_accuracy": spread([r["best_accuracy"] for r in runs if r["best_accuracy"] is not None])}


def median_run(runs: list[dict]) -> Optional[dict]:
    """The run a cell's plot line shows: the converged run of median seconds (the lower middle
    of an even count), else the run that got closest."""
    hits = sorted((r for r in runs if r["converged"]), key=lambda r: r["seconds"])
    if hits:
        return hits[(len(hits) - 1) // 2]
    scored = [r for r in runs if r["best_accuracy"] is not None]
    return max(scored, key=lambda r: r["best_accuracy"]) if scored else None
