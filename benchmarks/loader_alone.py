"""The loader measured alone, no model: images per second per core of hvdcls's loader (both
backends) beside torchvision's, a plain tf.data pipeline's and DALI's CPU pipeline, over JPEGs
made from real photographs at three sizes, with the training and the evaluation transform.

    python benchmarks/loader_alone.py --output-dir runs/loader-alone --rounds 2 \\
        --timed-images imagenet=512 448=512 12mp=64 --loader-workers 1 --batch-size 32

The photos (hvdcls.bench.photos: scikit-image's sample photographs cropped, scaled and
re-encoded at quality 90; ImageNet-like 500x375, 448x448, 12 MP 4000x3000) are written once
under --photo-dir. Each pipeline (benchmarks/loader_pipelines.py says what each one runs)
lives in its own process for the whole run, so its imports happen once; the cells go round
robin: each round, for each size and transform, every pipeline in turn (the order rotated each
round), so a machine that drifts slows them alike. A repetition builds the pipeline afresh,
takes --warmup-steps batches untimed (the workers start there), then times --timed-images
images. Each size's data set holds more than one repetition reads, so no epoch restarts in
the timed part. Rates per core (hvdcls/bench/loader_report.py): images/s divided by
--loader-workers, and images per CPU-second of the pipeline's processes.

Outputs in --output-dir: results.json (every repetition, the cells, the targets) and
results.md (the table). DALI runs where `--dali-python` (default: this Python) imports
nvidia.dali; elsewhere it is reported as not installed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # hvdcls from this checkout, when run as a script

from loader_pipelines import PIPELINES  # noqa: E402

TRANSFORMS = ("train", "eval")
SIZES = ("imagenet", "448", "12mp")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--pipelines", nargs="+", choices=PIPELINES, default=list(PIPELINES))
    parser.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES))
    parser.add_argument("--transforms", nargs="+", choices=TRANSFORMS, default=list(TRANSFORMS))
    parser.add_argument("--timed-images", nargs="+", default=["imagenet=1024", "448=1024", "12mp=128"],
                        help="SIZE=N: images timed per repetition")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--loader-workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--warmup-steps", type=int, default=0, help="untimed batches first (default: 2 x workers)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--photo-dir", type=Path, default=HERE.parent / "build" / "loader_photos")
    parser.add_argument("--dali-python", default=sys.executable, help="a Python that imports nvidia.dali")
    parser.add_argument("--serve", choices=PIPELINES, help=argparse.SUPPRESS)  # one pipeline's process
    return parser.parse_args(argv)


def timed_images(args: argparse.Namespace) -> dict[str, int]:
    found = dict(item.split("=", 1) for item in args.timed_images)
    return {size: -(-int(found[size]) // args.batch_size) * args.batch_size for size in args.sizes}


# --- inside one pipeline's process ---------------------------------------------------------

def cpu_seconds() -> float:
    """User + system CPU of this process, its live descendants (DataLoader workers) and the
    descendants it has reaped (a loader's workers stopped at the end of an epoch)."""
    import psutil

    me = psutil.Process()
    reaped = me.cpu_times()
    total = reaped.children_user + reaped.children_system
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def serve(pipeline: str) -> int:
    """Repetitions asked for on stdin (one JSON object a line), results on stdout."""
    from loader_pipelines import batches, set_threads

    set_threads(pipeline)
    print(json.dumps({"ready": pipeline}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        stream = batches(pipeline, Path(ask["root"]), ask["transform"] == "train", ask["batch_size"], ask["workers"])
        for _ in range(ask["warmup"]):
            next(stream)
        images, cpu0, started = 0, cpu_seconds(), time.perf_counter()
        while images < ask["images"]:
            images += len(next(stream)[1])
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu0
        close = getattr(stream, "close", None)
        if close:
            close()  # generators: the DataLoader's workers stop now, not at the next collection
        del stream
        print(json.dumps({"images": images, "seconds": seconds, "cpu_seconds": cpu}), flush=True)
    return 0


# --- the driver ----------------------------------------------------------------------------

def start(pipeline: str, args: argparse.Namespace) -> subprocess.Popen | str:
    """The pipeline's process, ready; or why it could not start (DALI not installed)."""
    python = args.dali_python if pipeline == "dali" else sys.executable
    if pipeline == "dali":
        probe = subprocess.run([python, "-c", "import nvidia.dali, psutil"], capture_output=True, text=True)
        if probe.returncode:
            return f"not installed for {python}: {probe.stderr.strip().splitlines()[-1]}"
    proc = subprocess.Popen([python, __file__, "--output-dir", str(args.output_dir), "--serve", pipeline],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE)
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    if not ready:
        return f"exited with status {proc.wait()} before it was ready"
    return proc


def ask(proc: subprocess.Popen, request: dict) -> dict:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(request) + "\n")
    proc.stdin.flush()
    answer = proc.stdout.readline()
    if not answer:
        raise RuntimeError(f"the pipeline's process exited with status {proc.wait()}")
    return json.loads(answer)


def versions(dali_python: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("torch", "torchvision", "tensorflow-cpu", "tensorflow", "pillow", "numpy", "scikit-image"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    probe = subprocess.run([dali_python, "-c", "import nvidia.dali as d; print(d.__version__)"],
                           capture_output=True, text=True)
    found["nvidia-dali"] = probe.stdout.strip() if probe.returncode == 0 else "not installed"
    return found


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.machine())


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.serve:
        return serve(args.serve)
    from hvdcls.bench import loader_report, photos

    images = timed_images(args)
    warmup = args.warmup_steps or 2 * args.loader_workers
    samples = photos.sample_photos()
    roots = {}
    for size in args.sizes:  # every repetition reads within one epoch: warm-up + timed + 2 batches
        count = images[size] + (warmup + 2) * args.batch_size
        roots[size] = photos.write_photo_set(args.photo_dir, photos.SIZES[size], count, samples)
    procs, skipped = {}, {}
    for pipeline in args.pipelines:
        started = start(pipeline, args)
        if isinstance(started, str):
            skipped[pipeline] = started
            print(f"{pipeline}: {started}", file=sys.stderr)
        else:
            procs[pipeline] = started
    reps = []
    try:
        for round_ in range(args.rounds):
            order = list(procs)[round_ % len(procs):] + list(procs)[:round_ % len(procs)]
            for size in args.sizes:
                for transform in args.transforms:
                    for pipeline in order:
                        got = ask(procs[pipeline], {"root": str(roots[size]), "transform": transform,
                                                    "batch_size": args.batch_size, "workers": args.loader_workers,
                                                    "warmup": warmup, "images": images[size]})
                        rep = {"round": round_, "size": size, "transform": transform, "pipeline": pipeline, **got,
                               **loader_report.rates(got["images"], got["seconds"], got["cpu_seconds"],
                                                     args.loader_workers)}
                        reps.append(rep)
                        print(json.dumps({k: rep[k] for k in ("round", "size", "transform", "pipeline")}
                                         | {"per_worker": round(rep["per_worker"], 1)}), flush=True)
    finally:
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait()
    cells = loader_report.summarise(reps)
    table = loader_report.markdown(cells, args.sizes, args.transforms, list(procs))
    found = loader_report.verdicts(cells)
    result = {"command": sys.argv, "machine": {"cores": os.cpu_count(), "cpu": cpu_model()},
              "versions": versions(args.dali_python), "loader_workers": args.loader_workers,
              "batch_size": args.batch_size, "warmup_steps": warmup, "timed_images": images, "rounds": args.rounds,
              "skipped": skipped, "reps": reps, "targets": found,
              "cells": [{"size": s, "transform": t, "pipeline": p, **cell} for (s, t, p), cell in cells.items()]}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    notes = "".join(f"\n{name}: {why}\n" for name, why in skipped.items())
    (args.output_dir / "results.md").write_text(table + "\n" + loader_report.verdict_lines(found) + notes)
    print(table + "\n" + loader_report.verdict_lines(found) + notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
