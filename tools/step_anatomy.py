"""Where the time of hvdcls's training step goes, against DDP's on the same step (issue 27).

    python tools/step_anatomy.py --output-dir runs/anatomy            # ~3 min on a quiet 2-core host
    python tools/step_anatomy.py --output-dir runs/anatomy-cycle0 --env HOROVOD_CYCLE_TIME=0.1
    python tools/step_anatomy.py --report-only runs/anatomy           # re-read what a run kept

For each stack (hvdcls: the bench worker under `horovodrun --gloo`; ddp: benchmarks/ddp_torch.py
under `torchrun`), ResNet-18, 64 px, batch 32 per rank, np=2, one compute thread per rank, the
bench's Horovod settings (32 MB fusion, 5 ms cycle), two launches:

1. probe: each rank's thread counters over the timed steps (CPU time, time runnable but waiting
   for a core, voluntary/involuntary context switches; hvdcls.bench.anatomy), when each
   gradient is ready in backward (hooks), and how it is reduced: Horovod's timeline on hvdcls
   (HOROVOD_TIMELINE with cycle marks), each bucket's communication on DDP (a timing comm hook);
2. profile: the same without hooks or timeline, with `perf record` on every thread of each rank
   (Horovod's background thread and Gloo's have no Python state, so only perf sees them) and
   `py-spy record --native` on rank 0's Python thread, for --profile-seconds of the timed steps.

Writes into --output-dir: each launch's raw files (<stack>/probe/, <stack>/profile/), then
anatomy.json and anatomy.md (hvdcls.bench.anatomy_report): per-thread CPU, the step's phases
(backward, the communication tail after it, the reduce rounds), gradient-ready order against
reduce order, the top symbols of each thread. Needs Linux's /proc; perf (Debian's linux-perf)
and py-spy (requirements/test.txt) for the profile, which is skipped with a note without them.
Numbers from a machine that other work loads are not findings: the report records the load.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's hvdcls first

from hvdcls.bench import anatomy, anatomy_report, guard, processes
from hvdcls.bench import matrix as bench
from hvdcls.files import fileio
from hvdcls.launching import launch

STACKS = {"hvdcls": "hvdcls", "ddp": "ddp"}  # stack -> the bench's runner


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path)
    parser.add_argument("--report-only", type=Path, metavar="DIR", help="re-read DIR, launch nothing")
    parser.add_argument("--stacks", nargs="+", default=list(STACKS), choices=list(STACKS))
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--fusion-threshold-mb", type=float, default=bench.BenchSpec.fusion_threshold_mb)
    parser.add_argument("--cycle-time-ms", type=float, default=bench.BenchSpec.cycle_time_ms)
    parser.add_argument("--wait", default="auto", choices=bench.WAITS, help="horovod.wait of the hvdcls stack")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="more environment for every launch (e.g. HOROVOD_CYCLE_TIME=1)")
    parser.add_argument("--profile-seconds", type=float, default=6.0)
    parser.add_argument("--no-profile", action="store_true", help="the probe launches only")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    if (args.output_dir is None) == (args.report_only is None):
        parser.error("give --output-dir (measure) or --report-only DIR (re-read)")
    return args


def spec_of(args: argparse.Namespace) -> bench.BenchSpec:
    return bench.BenchSpec(backends=["torch"], nps=[args.np], compressions=["none"],
                           batch_sizes=[args.batch_size], models=[args.model], image_size=args.image_size,
                           warmup=args.warmup, steps=args.steps, reps=args.reps,
                           fusion_threshold_mb=args.fusion_threshold_mb, cycle_time_ms=args.cycle_time_ms)


def launch_cell(stack: str, args: argparse.Namespace, directory: Path, probe: bool) -> subprocess.Popen:
    """The stack's bench cell with the anatomy probe on, started (not waited for)."""
    spec = spec_of(args)
    cell = bench.Cell(STACKS[stack], "torch", args.np, "none", args.batch_size, args.model, wait=args.wait)
    directory.mkdir(parents=True, exist_ok=True)
    flags = ["--anatomy", str(directory)] + (["--anatomy-hooks"] if probe else [])
    env = bench.environment(cell, spec)
    env.update(dict(item.split("=", 1) for item in args.env))
    if probe and stack == "hvdcls":  # rank 0 writes Horovod's timeline, with each cycle marked
        env.update(HOROVOD_TIMELINE=str(directory / "timeline.json"), HOROVOD_TIMELINE_MARK_CYCLES="1")
    command = bench.command(cell, spec, directory / "result.json") + flags
    fileio.write_json_atomic(directory / "launch.json", {"command": command, "environment": {
        k: v for k, v in env.items() if k.startswith(("HOROVOD_", "OMP_", "MKL_", "GLOO_"))}})
    log = open(directory / "launch.log", "w")  # noqa: SIM115  (closed with the process, in finish)
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def finish(process: subprocess.Popen, timeout: float) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        processes.kill_group(process)
        return 124
    finally:
        if process.poll() is None:
            processes.kill_group(process)


def started_pids(directory: Path, ranks: int, process: subprocess.Popen, timeout: float) -> list[int]:
    """The ranks' pids, once every rank has entered its timed steps (the probe's marker)."""
    deadline = time.monotonic() + timeout
    markers = [directory / f"rank{r}.started" for r in range(ranks)]
    while not all(m.exists() for m in markers):
        if process.poll() is not None or time.monotonic() > deadline:
            return []
        time.sleep(0.2)
    return [json.loads(m.read_text())["pid"] for m in markers]


def profilers(pids: list[int], directory: Path, seconds: float) -> list[subprocess.Popen]:
    """perf on every thread of each rank, py-spy on rank 0's Python thread, for `seconds`."""
    running = []
    perf, spy = shutil.which("perf"), launch.venv_tool("py-spy")
    if perf:
        for rank, pid in enumerate(pids):
            running.append(subprocess.Popen(
                [perf, "record", "-F", "250", "-p", str(pid), "-o", str(directory / f"perf-rank{rank}.data"),
                 "--", "sleep", f"{seconds:g}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if shutil.which(spy) or Path(spy).exists():
        running.append(subprocess.Popen(
            [spy, "record", "--pid", str(pids[0]), "--native", "--threads", "--format", "raw",
             # --native needs the process paused for each sample: 20 a second, a light touch
             "--rate", "20", "--duration", f"{seconds:g}",
             "--output", str(directory / "py-spy-rank0.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return running


def keep_threads(directory: Path, pids: list[int], before: dict[int, dict], started: int) -> None:
    """Each rank's thread counters over exactly the profilers' interval, read from outside
    (threads-rank<R>.json, in the probe's format), so they line up with perf's samples."""
    for rank, pid in enumerate(pids):
        try:
            after = anatomy.thread_counters(pid)
        except OSError:  # the rank ended first: the report falls back to the window's counters
            continue
        fileio.write_json_atomic(directory / f"threads-rank{rank}.json", {
            "rank": rank, "pid": pid, "window_ns": [started, time.time_ns()],
            "threads": {str(t): c for t, c in anatomy.counters_between(before[rank], after).items()}})


def perf_reports(directory: Path) -> None:
    """perf's per-thread symbol table of each rank as text (perf-rank<R>.txt), tab-separated."""
    for data in sorted(directory.glob("perf-rank*.data")):
        text = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children",
                               "--sort", "pid,dso,sym", "--field-separator", "\t"],
                              capture_output=True, text=True).stdout
        data.with_suffix(".txt").write_text(text)
        data.unlink()


def measure(stack: str, args: argparse.Namespace, out: Path) -> dict:
    """The stack's two launches; what each exited with and the CPU others used meanwhile."""
    runs = {}
    for kind in ("probe", "profile"):
        if kind == "profile" and args.no_profile:
            continue
        directory = out / stack / kind
        shutil.rmtree(directory, ignore_errors=True)
        with guard.CpuGuard() as watch:
            process = launch_cell(stack, args, directory, probe=kind == "probe")
            notes = []
            if kind == "profile":
                pids = started_pids(directory, args.np, process, args.timeout)
                before = {rank: anatomy.thread_counters(pid) for rank, pid in enumerate(pids)}
                started = time.time_ns()
                sampling = profilers(pids, directory, args.profile_seconds) if pids else []
                for sampler in sampling:
                    sampler.wait()
                keep_threads(directory, pids, before, started)
                notes.append(f"{len(sampling)} profilers ran" if pids else "the ranks never reached their timed steps")
            code = finish(process, args.timeout)
        if kind == "profile" and shutil.which("perf"):
            perf_reports(directory)
        runs[kind] = {"exit": code, "notes": notes,
                      "outside_cpu_share": watch.outside.share if watch.outside else None}
        print(f"{stack} {kind}: exit {code}", file=sys.stderr)
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = args.report_only or args.output_dir
    if args.output_dir is not None:
        out.mkdir(parents=True, exist_ok=True)
        runs = {stack: measure(stack, args, out) for stack in args.stacks}
        fileio.write_json_atomic(out / "runs.json", {"args": {k: str(v) for k, v in vars(args).items()},
                                                     "load_average_after": os.getloadavg(), "runs": runs})
    report = anatomy_report.build(out)
    fileio.write_json_atomic(out / "anatomy.json", report)
    text = anatomy_report.markdown(report)
    fileio.write_atomic(out / "anatomy.md", text.encode())
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
