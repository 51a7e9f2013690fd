"""`hvdcls timeline PATH`: Horovod's timeline as a few numbers instead of a trace to open.

    horovodrun -np 2 -H localhost:2 hvdcls train horovod.timeline=/tmp/timeline.json
    hvdcls timeline /tmp/timeline.json          # a table
    hvdcls timeline /tmp/timeline.json --json   # the same numbers, machine-readable

Horovod writes the timeline on rank 0 as Chrome-trace JSON: one array of events, one "process"
(pid) per tensor name. Each tensor's collective shows as a NEGOTIATE_<OP> span (from the
first rank announcing the tensor ready until every rank has: waiting for the slowest rank),
then an <OP> span (ALLREDUCE, BROADCAST, ...) holding its activities (WAIT_FOR_DATA,
MEMCPY_IN_FUSION_BUFFER, GLOO_ALLREDUCE, ...); the <OP>'s closing event carries the tensor's
dtype and shape. A running job's file has no closing `]`, and a long job's file is gigabytes,
so the file is streamed event by event and an unterminated or cut-off tail is tolerated.

What the numbers mean:
- per op type: the summed duration over tensors (fused tensors each count their own span);
- collective rounds: overlapping collective spans merged across tensors; Horovod's
  background thread runs one fused response at a time, so one merged span is one round;
- communication busy: the length of those merged spans, and its share of the traced time;
- negotiation: the merged NEGOTIATE_* spans (ranks waiting for each other, not the network);
- fused bytes: the bytes of tensors that went through the fusion buffer.
"""
from __future__ import annotations

import json
import math
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Optional, TextIO

import numpy as np

from hvdcls import tables
from hvdcls.errors import UserError

CHUNK_CHARS = 1 << 20
MAX_EVENT_CHARS = 1 << 20  # an "event" longer than this is corruption, not a partial read
NEGOTIATE_PREFIX = "NEGOTIATE_"
DTYPE_BYTES = {"uint8": 1, "int8": 1, "bool": 1, "int16": 2, "float16": 2, "bfloat16": 2,
               "int32": 4, "float32": 4, "int64": 8, "float64": 8}


class EventStream:
    """Iterates a Chrome-trace JSON array's objects without holding the file in memory.

    After iteration: `complete` says whether the closing `]` was reached, `unparsed_chars`
    how much of the tail could not be read as an event (a write cut short)."""

    def __init__(self, path: Path, chunk_chars: int = CHUNK_CHARS):
        self.path, self.chunk_chars = Path(path), chunk_chars
        self.complete, self.unparsed_chars = False, 0

    def __iter__(self) -> Iterator[dict]:
        decoder = json.JSONDecoder()
        buffer, pos = "", 0
        with open(self.path, encoding="utf-8", errors="replace") as handle:
            while True:
                chunk = handle.read(self.chunk_chars)
                buffer, pos = buffer[pos:] + chunk, 0
                while True:
                    pos = _skip_separators(buffer, pos)
                    if pos == len(buffer):
                        break
                    if buffer[pos] == "]":
                        self.complete = True
                        return
                    try:
                        event, pos = decoder.raw_decode(buffer, pos)
                    except json.JSONDecodeError:
                        if chunk and len(buffer) - pos <= MAX_EVENT_CHARS:
                            break  # the event continues in the next chunk
                        self.unparsed_chars = len(buffer) - pos
                        return
                    if isinstance(event, dict):
                        yield event
                if not chunk:
                    return


def _skip_separators(text: str, pos: int) -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] in "[,"):
        pos += 1
    return pos


@dataclass
class OpStats:
    count: int = 0
    seconds: float = 0.0
    bytes: int = 0


@dataclass
class TimelineSummary:
    path: str
    events: int
    complete: bool
    unparsed_chars: int
    traced_seconds: float
    tensors: int
    ops: dict = field(default_factory=dict)  # name -> OpStats, collectives and activities
    rounds: int = 0
    communication_seconds: float = 0.0
    communication_share: float = 0.0
    negotiation_seconds: float = 0.0
    fused_tensors: int = 0
    fused_bytes: int = 0

    @property
    def seconds_per_round(self) -> float:
        return self.communication_seconds / self.rounds if self.rounds else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "seconds_per_round": self.seconds_per_round}


def tensor_bytes(args: dict) -> int:
    """Bytes of a tensor from the closing event's {"dtype": "float32", "shape": "[32, 3]"}."""
    dims = [int(d) for d in str(args.get("shape", "[]")).strip("[]").split(",") if d.strip()]
    return math.prod(dims) * DTYPE_BYTES.get(args.get("dtype", ""), 0)


class _Accumulator:
    """Pairs each tensor's B/E events and adds them up; memory grows with the number of
    collective spans (16 bytes each), not with the file."""

    def __init__(self):
        self.open: dict[int, list] = {}  # pid -> stack of [name, start_us, fused]
        self.tensors: set[int] = set()
        self.ops: dict[str, OpStats] = {}
        self.collective, self.negotiation = (array("d"), array("d")), (array("d"), array("d"))
        self.first, self.last = math.inf, -math.inf
        self.fused_tensors = self.fused_bytes = 0

    def add(self, event: dict) -> None:
        phase, pid, ts = event.get("ph"), event.get("pid", 0), event.get("ts")
        if phase == "M" or ts is None:
            if event.get("name") == "process_name" and "name" in event.get("args", {}):
                self.tensors.add(pid)
            return
        self.first, self.last = min(self.first, ts), max(self.last, ts)
        stack = self.open.setdefault(pid, [])
        if phase == "B":
            if stack and event.get("name") == "MEMCPY_IN_FUSION_BUFFER":
                stack[0][2] = True  # the enclosing collective ran through the fusion buffer
            stack.append([event.get("name", "?"), ts, False])
        elif phase == "E" and stack:
            name, start, fused = stack.pop()
            self._close(name, start, ts, top_level=not stack, fused=fused, args=event.get("args", {}))

    def _close(self, name: str, start: float, end: float, top_level: bool, fused: bool,
               args: dict) -> None:
        stats = self.ops.setdefault(name, OpStats())
        stats.count += 1
        stats.seconds += (end - start) / 1e6
        if not top_level:
            return
        spans = self.negotiation if name.startswith(NEGOTIATE_PREFIX) else self.collective
        spans[0].append(start)
        spans[1].append(end)
        size = tensor_bytes(args) if args else 0
        stats.bytes += size
        if fused:
            self.fused_tensors += 1
            self.fused_bytes += size


def merged_spans(starts, ends) -> tuple[int, float]:
    """(number of disjoint spans, their total length) after merging overlapping ones."""
    if not len(starts):
        return 0, 0.0
    starts, ends = np.asarray(starts, np.float64), np.asarray(ends, np.float64)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)  # how far the spans so far extend
    opens = np.concatenate(([True], starts[1:] > reach[:-1]))  # a span that starts a new group
    firsts = np.flatnonzero(opens)
    group_ends = np.maximum.reduceat(ends, firsts)
    return len(firsts), float(np.sum(group_ends - starts[firsts]))


def summarize(path: Path, chunk_chars: int = CHUNK_CHARS) -> TimelineSummary:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"timeline {path} does not exist (set horovod.timeline=PATH when training)")
    stream, acc, events = EventStream(path, chunk_chars), _Accumulator(), 0
    for event in stream:
        acc.add(event)
        events += 1
    if acc.first == math.inf:
        raise UserError(f"{path} holds no timeline events: not a Horovod timeline "
                        "(a Chrome-trace JSON array), or written before the first collective")
    rounds, busy_us = merged_spans(*acc.collective)
    _, negotiation_us = merged_spans(*acc.negotiation)
    traced = (acc.last - acc.first) / 1e6
    return TimelineSummary(
        path=str(path), events=events, complete=stream.complete,
        unparsed_chars=stream.unparsed_chars, traced_seconds=traced, tensors=len(acc.tensors),
        ops={name: asdict(stats) for name, stats in sorted(acc.ops.items())}, rounds=rounds,
        communication_seconds=busy_us / 1e6,
        communication_share=(busy_us / 1e6) / traced if traced > 0 else 0.0,
        negotiation_seconds=negotiation_us / 1e6, fused_tensors=acc.fused_tensors,
        fused_bytes=acc.fused_bytes)


def format_summary(s: TimelineSummary) -> str:
    state = "complete" if s.complete else "unterminated (a running or killed job)"
    if s.unparsed_chars:
        state += f", last {s.unparsed_chars} characters unreadable"
    lines = [f"timeline {s.path}: {s.events:,} events, {s.traced_seconds:.3f} s traced, {state}",
             f"tensors: {s.tensors}",
             ""]
    ops = []
    for name, op in s.ops.items():
        mean_ms = 1000 * op["seconds"] / op["count"] if op["count"] else 0.0
        size = f"{op['bytes'] / 1e6:.3f}" if op["bytes"] else ""
        ops.append([name, str(op["count"]), f"{op['seconds']:.3f}", f"{mean_ms:.3f}", size])
    lines += tables.text(["op", "count", "total s", "mean ms", "MB"], ops, align="<>>>>",
                         widths=(28, 8, 10, 9, 10), gap=" ")
    lines += ["",
              f"collective rounds:   {s.rounds} ({s.fused_tensors} tensors fused, "
              f"{s.fused_bytes / 1e6:.3f} MB through the fusion buffer)",
              f"communication busy:  {s.communication_seconds:.3f} s of {s.traced_seconds:.3f} s "
              f"traced = {100 * s.communication_share:.1f} % ({1000 * s.seconds_per_round:.3f} ms "
              "per round)",
              f"negotiation:         {s.negotiation_seconds:.3f} s (ranks waiting for each other)"]
    return "\n".join(lines)


def main(path: Path, as_json: bool = False, out: Optional[TextIO] = None) -> int:
    summary = summarize(path)
    text = json.dumps(summary.to_dict(), indent=2, sort_keys=True) if as_json else format_summary(summary)
    print(text, file=out)
    return 0
