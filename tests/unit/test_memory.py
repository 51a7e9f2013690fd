"""hvdcls.training.memory: summary.json's `memory`, a backend's tensor bytes plus the peak RSS."""
from hvdcls.training import memory

COUNTS = {"param_bytes": 40, "grad_bytes": 40, "optimizer_state_bytes": 80}


class Counting:
    """The two backend methods memory uses: its counts, and a world of two gathering."""

    def memory(self):
        return dict(COUNTS)

    def allgather_object(self, obj, name):
        assert name == "memory"
        return [obj, {**obj, "optimizer_state_bytes": 0}]


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    import os
    return pages * os.sysconf("SC_PAGE_SIZE")


def test_peak_rss_is_in_bytes_and_at_least_the_current_resident_set():
    peak = memory.peak_rss_bytes()
    assert peak >= resident_bytes() * 0.9  # KiB taken for bytes would be 1024x too small
    assert peak < 1 << 40


def test_summarise_gives_this_ranks_counts_and_every_ranks():
    mine, ranks = memory.summarise(Counting())
    assert {k: mine[k] for k in COUNTS} == COUNTS and mine["peak_rss_bytes"] > 0
    assert ranks[0] == mine and ranks[1]["optimizer_state_bytes"] == 0
