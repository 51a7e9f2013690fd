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


def test_each_phase_reports_its_own_peak_and_the_overall_peak_survives_the_resets():
    """PhasePeaks resets the kernel's high-water mark between phases: 200 MB held only inside
    `checkpoint` is that phase's peak, not `training`'s after it, and peak_rss_bytes (whose
    getrusage mark the reset lowers too) still counts it."""
    peaks = memory.PhasePeaks()
    assert peaks.working  # Linux: VmHWM and clear_refs
    peaks.restart()
    peaks.enter(memory.CHECKPOINT)
    before = resident_bytes()
    held = bytearray(200 * 2**20)  # zero-filled: every page touched
    del held
    peaks.enter(memory.TRAINING)
    report = peaks.report()
    assert set(report) == {"peak_rss_setup_bytes", "peak_rss_checkpoint_bytes", "peak_rss_training_bytes"}
    assert report["peak_rss_checkpoint_bytes"] >= before + 190 * 2**20  # the kernel counts pages in batches
    assert report["peak_rss_training_bytes"] < report["peak_rss_checkpoint_bytes"] - 150 * 2**20
    assert peaks.highest >= report["peak_rss_checkpoint_bytes"]


def test_summary_memory_names_the_phases_of_this_run():
    memory.PEAKS.restart()
    memory.PEAKS.enter(memory.TRAINING)
    mine, _ = memory.summarise(Counting())
    assert mine["peak_rss_training_bytes"] > 0 and mine["peak_rss_setup_bytes"] > 0
    assert mine["peak_rss_bytes"] >= mine["peak_rss_training_bytes"]
