"""summary.json's `memory`: this rank's bytes in the model's tensors (the backend counts them,
hvdcls.backend.Backend.memory) and the process's peak resident set, and every rank's beside
it (`rank_memory`), so that what sharding saves per rank can be read off one file."""
from __future__ import annotations

import resource
import sys

from hvdcls.backend import Backend


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (getrusage: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def measure(backend: Backend) -> dict[str, int]:
    return {**backend.memory(), "peak_rss_bytes": peak_rss_bytes()}


def summarise(backend: Backend) -> tuple[dict[str, int], list[dict[str, int]]]:
    """(this rank's, every rank's in rank order): a collective, every rank calls it."""
    mine = measure(backend)
    return mine, backend.allgather_object(mine, "memory")
