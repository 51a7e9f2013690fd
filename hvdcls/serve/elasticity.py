"""Queue-length elasticity: shrink running elastic jobs to admit the head of the queue, grow
them back when nothing waits (pure logic; the service applies it through each job's discovery
file, which Horovod's elastic driver reads).

Shrinking happens only when it actually admits the head: taking slots from elastic jobs that
still leaves the head waiting would slow them for nothing. No job is resized twice within the
cool-down, so a job is not rocked back and forth by a queue that fills and drains quickly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hvdcls.serve.scheduler import Allocation, place


@dataclass(frozen=True)
class Resizable:
    job_id: int
    size: int  # slots it holds now
    min_np: int
    max_np: int
    resized_at: float  # its start or its last resize


def resize(head_np: Optional[int], free: int, jobs: list[Resizable], now: float,
           cooldown: float) -> dict[int, int]:
    """{job id: new size} for the elastic jobs to resize now (none when nothing should change).
    `head_np`: what the head of the queue needs (None: the queue is empty)."""
    ready = [job for job in jobs if now - job.resized_at >= cooldown]
    if head_np is not None:
        return shrink_to_admit(head_np - free, ready)
    sizes: dict[int, int] = {}
    for job in sorted(ready, key=lambda j: j.job_id):  # the oldest job first
        grow = min(job.max_np - job.size, free)
        if grow > 0:
            sizes[job.job_id], free = job.size + grow, free - grow
    return sizes


def shrink_to_admit(deficit: int, ready: list[Resizable]) -> dict[int, int]:
    """Take `deficit` slots from the jobs with most to spare above their min_np; none if they
    cannot give that many together."""
    if deficit <= 0 or sum(job.size - job.min_np for job in ready) < deficit:
        return {}
    sizes: dict[int, int] = {}
    for job in sorted(ready, key=lambda j: (j.min_np - j.size, -j.job_id)):  # most spare, newest
        take = min(job.size - job.min_np, deficit)
        if take > 0:
            sizes[job.job_id], deficit = job.size - take, deficit - take
        if deficit == 0:
            break
    return sizes


def shrunk(allocation: Allocation, size: int) -> Allocation:
    """`allocation` cut to `size` slots: the hosts with fewest slots are dropped first, so the
    job keeps to as few hosts as possible (Horovod drops the workers of a removed host)."""
    kept = dict(allocation)
    excess = sum(kept.values()) - size
    for host in sorted(kept, key=lambda h: (kept[h], h)):
        take = min(kept[host], excess)
        kept[host] -= take
        excess -= take
    return {host: slots for host, slots in kept.items() if slots > 0}


def grown(allocation: Allocation, size: int, free: dict[str, int]) -> Allocation:
    """`allocation` grown to `size` slots out of `free` (hosts the job uses first)."""
    extra = size - sum(allocation.values())
    preferred = {host: free.get(host, 0) for host in allocation}
    added = place(extra, {h: n for h, n in preferred.items() if n > 0}) or place(extra, free) or {}
    out = dict(allocation)
    for host, slots in added.items():
        out[host] = out.get(host, 0) + slots
    return out
