"""Which queued jobs start now, and on which slots: gang, first in first out, with backfill
that cannot delay the head of the queue.

Gang: a job starts with all its processes at once or not at all. Horovod places any number of
processes per host (`-H a:3,b:1`), so what a job needs is a count of slots; a job is placed on
as few hosts as possible (the hosts with most free slots first).

Backfill without run-time estimates: a later job may take free slots while the head waits only
if, whichever running jobs end first, the head can start at the same moment as it could
without the later job. Running jobs end in an unknown order, so every subset of them is
considered: for each set of endings that would let the head start, the later job's slots must
still leave enough. Anything less strict lets a small job push a large one back.
"""
from __future__ import annotations

from dataclasses import dataclass

from hvdcls.errors import UserError

Allocation = dict[str, int]  # host -> slots


@dataclass(frozen=True)
class Waiting:
    job_id: int
    np: int


def parse_hosts(text: str) -> dict[str, int]:
    """'a:2,b:2' (or one host:slots per line, # comments allowed) -> {'a': 2, 'b': 2}."""
    hosts: dict[str, int] = {}
    items = [part.split("#")[0].strip() for line in text.splitlines() for part in line.split(",")]
    for item in filter(None, items):
        name, sep, slots = item.rpartition(":")
        if not sep or not name or not slots.isdigit() or int(slots) < 1:
            raise UserError(f"host {item!r}: expected HOST:SLOTS with SLOTS >= 1 (e.g. worker1:2)")
        if name in hosts:
            raise UserError(f"host {name!r} is listed twice")
        hosts[name] = int(slots)
    if not hosts:
        raise UserError("the host inventory is empty: give --hosts HOST:SLOTS,... or --hosts-file")
    return hosts


def free_slots(inventory: dict[str, int], allocations: list[Allocation]) -> dict[str, int]:
    free = dict(inventory)
    for allocation in allocations:
        for host, slots in allocation.items():
            free[host] = free.get(host, 0) - slots
    return free


def place(np: int, free: dict[str, int]) -> Allocation | None:
    """`np` slots on as few hosts as possible, or None when they are not free."""
    if sum(max(slots, 0) for slots in free.values()) < np:
        return None
    allocation: Allocation = {}
    for host in sorted(free, key=lambda h: (-free[h], h)):
        take = min(free[host], np - sum(allocation.values()))
        if take > 0:
            allocation[host] = take
    return allocation


def ending_sums(sizes: list[int]) -> set[int]:
    """Slots freed by every possible set of running jobs ending (subset sums; 0 included)."""
    sums = {0}
    for size in sizes:
        sums |= {s + size for s in sums}
    return sums


def cannot_delay_head(head_np: int, free: int, running: list[int], candidate_np: int) -> bool:
    """Starting the candidate now leaves the head's earliest start unchanged, whatever ends first."""
    if candidate_np > free:
        return False
    return all(free + freed - candidate_np >= head_np
               for freed in ending_sums(running) if free + freed >= head_np)


def plan(queue: list[Waiting], inventory: dict[str, int],
         running: list[Allocation]) -> list[tuple[int, Allocation]]:
    """The jobs of `queue` (in submission order) to start now, each with its slots."""
    free = free_slots(inventory, running)
    sizes = [sum(a.values()) for a in running]
    starts: list[tuple[int, Allocation]] = []
    waiting = list(queue)
    while waiting:  # the head starts whenever it fits; then the next one is the head
        allocation = place(waiting[0].np, free)
        if allocation is None:
            break
        starts.append((waiting[0].job_id, allocation))
        free, sizes = free_slots(free, [allocation]), sizes + [waiting[0].np]
        waiting.pop(0)
    if not waiting:
        return starts
    head = waiting[0]
    for job in waiting[1:]:
        if cannot_delay_head(head.np, sum(free.values()), sizes, job.np):
            allocation = place(job.np, free)
            assert allocation is not None  # cannot_delay_head found its slots free
            starts.append((job.job_id, allocation))
            free, sizes = free_slots(free, [allocation]), sizes + [job.np]
    return starts
