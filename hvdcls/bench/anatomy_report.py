"""What tools/step_anatomy.py kept, read back as findings: anatomy.json and anatomy.md.

For each stack (hvdcls, ddp) directory holding probe/ and profile/ (hvdcls.bench.anatomy's
files, the launch's result.json, Horovod's timeline.json for hvdcls, perf-rank<R>.txt and
py-spy-rank0.txt from the profile launch):

- threads: per thread of each rank over the timed steps (profile launch), CPU seconds and their
  share of the wall time, the time it was runnable but waited for a core, context switches per
  second, and a role read from its perf symbols (Horovod's background thread, Gloo's transport
  loop, the Python thread, ...), with its top symbols;
- phases of the step (probe launch, rank 0, medians over the timed steps, in ms): forward (step
  start to the first gradient ready), backward (first to last gradient ready), the communication
  tail (last gradient ready to the last reduction's end: the time the step waits for
  communication once backward is done), the update after it, the reduce rounds (Horovod's
  merged ALLREDUCE spans; DDP's buckets), and on Horovod how long a ready gradient waited for its
  round to start, how long negotiation took and how many background cycles a step ran;
- order: whether gradients are reduced in the order backward makes them (Horovod: the share of
  tensor pairs reduced in the other order than they became ready).
"""
from __future__ import annotations

import json
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Optional

from hvdcls import tables
from hvdcls.observe.timeline import EventStream, merged_spans

ROLES = [  # (pattern over a thread's perf libraries and symbols, role), first match wins
    (r"TimelineWriter", "Horovod timeline writer"),
    (r"gloo::transport::tcp::Loop", "Gloo transport loop"),
    # Horovod's extension (mpi_lib*.so) holds its background thread's code: negotiation, the
    # fusion buffer, and the Gloo collectives it runs itself.
    (r"mpi_lib|horovod::", "Horovod background"),
    (r"libtorch\S* \S*(gloo::|ProcessGroupGloo)", "torch c10d Gloo worker"),
    (r"gomp|omp_", "OpenMP worker"),
    (r"_copy_to_iter|_copy_from_iter|sock_poll|tcp_|ep_poll", "socket I/O (Gloo's transport loop)"),
]


def read_json(path: Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.exists() else None


def median(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def perf_symbols(path: Path) -> dict[int, list[tuple[float, str, str]]]:
    """perf report's tab-separated table: tid -> [(share of the process's samples, library, symbol)]."""
    out: dict[int, list] = defaultdict(list)
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        fields = [f.strip() for f in line.split("\t")]
        if line.startswith("#") or len(fields) < 4 or not fields[0].endswith("%"):
            continue
        tid = int(fields[1].split(":")[0])
        out[tid].append((float(fields[0].rstrip("%")) / 100, fields[2], fields[3].split("] ", 1)[-1]))
    return out


def short_symbol(symbol: str, width: int = 60) -> str:
    """A C++ symbol without its template arguments and parameter lists, cut to `width`."""
    out, depth = [], 0
    for char in symbol.replace("(anonymous namespace)", "{anon}"):
        if char in "<(":
            depth += 1
        elif char in ">)" and depth:
            depth -= 1
        elif depth == 0:
            out.append(char)
    text = "".join(out).replace("{anon}", "(anon)")
    return text if len(text) <= width else text[:width - 1] + "…"


def role(tid: int, pid: int, symbols: list[tuple[float, str, str]]) -> str:
    if tid == pid:
        return "Python main (forward, backward, optimizer)"
    text = " ".join(f"{library} {symbol}" for _, library, symbol in symbols)
    return next((name for pattern, name in ROLES if re.search(pattern, text)), "other")


def thread_rows(rank: dict, symbols: dict[int, list]) -> list[dict]:
    seconds = (rank["window_ns"][1] - rank["window_ns"][0]) / 1e9
    rows = []
    for tid_text, counters in rank["threads"].items():
        tid = int(tid_text)
        mine = sorted(symbols.get(tid, []), reverse=True)
        rows.append({"tid": tid, "name": counters["name"], "role": role(tid, rank["pid"], mine),
                     "cpu_seconds": counters["cpu_seconds"], "cpu_share": counters["cpu_seconds"] / seconds,
                     "runqueue_wait_seconds": counters["runqueue_wait_seconds"],
                     "voluntary_per_second": counters["voluntary_switches"] / seconds,
                     "involuntary_per_second": counters["involuntary_switches"] / seconds,
                     "perf_share": sum(share for share, _, _ in mine),
                     "top_symbols": [f"{short_symbol(symbol)} ({library.strip('[]').split('.')[0]}, {share:.0%})"
                                     for share, library, symbol in mine[:4]]})
    return sorted(rows, key=lambda r: -r["cpu_seconds"])


def timeline_collectives(path: Path) -> tuple[list[dict], list[int]]:
    """Horovod's timeline as top-level spans in wall-clock ns ({tensor, op, start, end}) and the
    background thread's cycle starts; the file's first event states its start (UTC, µs)."""
    start_us, names, open_spans = 0, {}, defaultdict(list)
    spans, cycles = [], []
    for event in EventStream(path):
        phase, ts, pid = event.get("ph"), event.get("ts"), event.get("pid", 0)
        args = event.get("args") or {}
        if phase == "M":
            start_us = args.get("start_time_since_epoch_in_micros", start_us)
            if event.get("name") == "process_name" and "name" in args:
                names[pid] = args["name"]
            continue
        if ts is None:
            continue
        wall = int((start_us + ts) * 1000)
        if phase == "i" and event.get("name") == "CYCLE_START":
            cycles.append(wall)
        elif phase == "B":
            open_spans[pid].append((event.get("name", "?"), wall))
        elif phase == "E" and open_spans[pid]:
            op, begun = open_spans[pid].pop()
            if not open_spans[pid]:
                spans.append({"tensor": names.get(pid, str(pid)), "op": op, "start": begun, "end": wall})
    return spans, cycles


def parameter_of(tensor: str) -> str:
    """Horovod names a gradient's all-reduce `allreduce.<parameter>`."""
    return tensor.split(".", 1)[1] if tensor.startswith("allreduce.") else tensor


def discordant_share(ready: dict[str, int], reduced: dict[str, int]) -> Optional[float]:
    """The share of tensor pairs reduced in the other order than they became ready (ties in
    either order, e.g. one fused round, are not counted against it)."""
    names = [n for n in ready if n in reduced]
    pairs = discordant = 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if ready[a] != ready[b] and reduced[a] != reduced[b]:
                pairs += 1
                discordant += (ready[a] < ready[b]) != (reduced[a] < reduced[b])
    return discordant / pairs if pairs else None


def step_phases(rank: dict, reductions: list[dict], negotiations: list[dict], cycles: list[int]) -> list[dict]:
    """Per timed step of one rank: its phases in ms (see the module's docstring)."""
    out = []
    ready_by_step: dict[int, dict[str, int]] = defaultdict(dict)
    for step, name, ns in rank["ready"]:
        ready_by_step[step][name] = ns
    for index, (start, end) in enumerate(rank["steps"]):
        ready = ready_by_step.get(index, {})
        mine = [r for r in reductions if start <= r["start"] <= end]
        if not ready or not mine:
            continue
        first, last = min(ready.values()), max(ready.values())
        last_end = max(r["end"] for r in mine)
        rounds, busy = merged_spans([r["start"] for r in mine], [r["end"] for r in mine])
        started = {parameter_of(r["tensor"]): r["start"] for r in mine}
        waits = [(started[name] - ns) * 1e-6 for name, ns in ready.items() if name in started]
        negotiating = [n["end"] - n["start"] for n in negotiations if start <= n["start"] <= end]
        ms = 1e-6
        out.append({"step_ms": (end - start) * ms, "forward_ms": (first - start) * ms,
                    "backward_ms": (last - first) * ms, "tail_ms": (last_end - last) * ms,
                    "update_ms": (end - last_end) * ms, "rounds": rounds, "communication_busy_ms": busy * ms,
                    "ready_to_reduce_ms": median(waits), "ready_to_reduce_max_ms": max(waits, default=None),
                    "negotiation_ms": median(n * ms for n in negotiating),
                    "cycles": sum(start <= c <= end for c in cycles) if cycles else None,
                    "out_of_order": discordant_share(ready, started) if waits else None})
    return out


def probe_summary(directory: Path) -> Optional[dict]:
    ranks = [read_json(p) for p in sorted(directory.glob("rank*.json"))]
    if not ranks or ranks[0] is None:
        return None
    rank0 = ranks[0]
    negotiations: list[dict] = []
    cycles: list[int] = []
    if (directory / "timeline.json").exists():  # Horovod: what rank 0's timeline recorded
        spans, cycles = timeline_collectives(directory / "timeline.json")
        reductions = [s for s in spans if not s["op"].startswith("NEGOTIATE")]
        negotiations = [s for s in spans if s["op"].startswith("NEGOTIATE")]
    else:  # DDP: each bucket, from the timing comm hook
        reductions = [{"tensor": name, "start": s, "end": e, "bytes": b}
                      for _step, name, s, e, b in rank0["reductions"]]
    steps = step_phases(rank0, reductions, negotiations, cycles)
    keys = steps[0].keys() if steps else []
    result = read_json(directory / "result.json") or {}
    return {"images_per_sec": median(result.get("images_per_sec", [])), "steps": len(steps),
            "phases": {key: median(s[key] for s in steps) for key in keys},
            "gradients": len({name for _, name, _ in rank0["ready"]})}


def profile_summary(directory: Path) -> Optional[dict]:
    windows = [r for r in (read_json(p) for p in sorted(directory.glob("rank*.json"))) if r]
    if not windows:
        return None
    result = read_json(directory / "result.json") or {}
    # The counters over the profilers' own interval where the tool kept them, else the window's.
    ranks = [read_json(directory / f"threads-rank{r['rank']}.json") or r for r in windows]
    return {"images_per_sec": median(result.get("images_per_sec", [])),
            "threads": {str(r["rank"]): thread_rows(r, perf_symbols(directory / f"perf-rank{r['rank']}.txt"))
                        for r in ranks},
            "py_spy": py_spy_summary(directory / "py-spy-rank0.txt")}


def py_spy_summary(path: Path, top: int = 8) -> Optional[dict]:
    """py-spy's raw (collapsed) stacks: the frames most samples ended in (self) and the Python
    functions most samples were inside (inclusive; not those every sample is inside, the call
    chain down to the step), as shares of rank 0's samples."""
    if not path.exists():
        return None
    leaves: Counter[str] = Counter()
    inside: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")[1:]  # the first is the thread
        total += int(count)
        if frames:
            leaves[frames[-1]] += int(count)
        for frame in {f for f in frames if ".py:" in f}:
            inside[frame] += int(count)
    for frame in [f for f, n in inside.items() if n == total]:
        del inside[frame]

    def shares(counts: Counter[str]) -> list[tuple[str, float]]:
        return [(frame, n / total) for frame, n in counts.most_common(top)] if total else []

    return {"samples": total, "self": shares(leaves), "inclusive": shares(inside)}


def build(directory: Path) -> dict:
    directory = Path(directory)
    stacks = {}
    for stack in sorted(p.name for p in directory.iterdir() if (p / "probe").is_dir() or (p / "profile").is_dir()):
        stacks[stack] = {"probe": probe_summary(directory / stack / "probe"),
                         "profile": profile_summary(directory / stack / "profile")}
    return {"directory": str(directory), "runs": read_json(directory / "runs.json"), "stacks": stacks}


PHASES = ["step_ms", "forward_ms", "backward_ms", "tail_ms", "update_ms", "rounds",
          "communication_busy_ms", "ready_to_reduce_ms", "ready_to_reduce_max_ms", "negotiation_ms",
          "cycles", "out_of_order"]


def fmt(value, pattern: str = "{:.1f}") -> str:
    return "-" if value is None else pattern.format(value)


def markdown(report: dict) -> str:
    runs = report.get("runs") or {}
    lines = [f"# Step anatomy: {report['directory']}", ""]
    if runs:
        load = ", ".join(f"{v:.1f}" for v in runs.get("load_average_after", []))
        shares = [f"{stack} {kind} {fmt(r.get('outside_cpu_share'), '{:.0%}')}"
                  for stack, kinds in runs.get("runs", {}).items() for kind, r in kinds.items()]
        lines += [f"Load average after: {load}; CPU used by other processes during each launch: "
                  f"{', '.join(shares)} (above 10%: not a finding, measure again on a quiet machine).", ""]
    stacks = report["stacks"]
    probes = {s: v["probe"] for s, v in stacks.items() if v.get("probe")}
    if probes:
        lines += ["Phases of the step, rank 0, medians over the timed steps (probe launch, with hooks "
                  "and, for hvdcls, Horovod's timeline on):", ""]
        header = ["", *probes]
        body = [["img/s (probe launch)", *(fmt(p["images_per_sec"]) for p in probes.values())]]
        body += [[key, *(fmt(p["phases"].get(key), "{:.2f}" if key == "out_of_order" else "{:.1f}")
                         for p in probes.values())] for key in PHASES]
        lines += [*tables.markdown(header, body), ""]
    for stack, summary in stacks.items():
        profile = summary.get("profile")
        if not profile:
            continue
        lines += [f"## {stack}: threads over the timed steps (profile launch, "
                  f"{fmt(profile['images_per_sec'])} img/s with the profilers attached)", ""]
        for rank, rows in profile["threads"].items():
            lines += [f"Rank {rank}:", "", *tables.markdown(
                ["tid", "role", "CPU s", "CPU share", "waited for a core s", "voluntary/s",
                 "involuntary/s", "top symbols (perf)"],
                [[str(r["tid"]), r["role"], f"{r['cpu_seconds']:.2f}", f"{r['cpu_share']:.0%}",
                  fmt(r["runqueue_wait_seconds"], "{:.2f}"), f"{r['voluntary_per_second']:.0f}",
                  f"{r['involuntary_per_second']:.0f}", "; ".join(r["top_symbols"][:3])]
                 for r in rows if r["cpu_seconds"] > 0 or r["voluntary_per_second"] > 1]), ""]
        spy = profile.get("py_spy")
        if spy and spy["samples"]:
            lines += [f"py-spy, rank 0's Python thread ({spy['samples']} samples), inclusive:", "",
                      *(f"- {share:.0%} {frame}" for frame, share in spy["inclusive"]), ""]
    return "\n".join(lines) + "\n"
