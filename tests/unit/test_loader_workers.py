"""data.workers=auto (hvdcls.data.workers): the count from measured load and compute times,
bounded by this rank's cores; the setting as the config reads it."""
import time

import pytest

from hvdcls import config
from hvdcls.data import workers
from hvdcls.errors import UserError


class SlowBatches:
    """Reads each batch in `seconds` (an EpochBatches as LoaderWorkers uses it)."""

    def __init__(self, seconds: float, count: int = 5):
        self.seconds, self.count, self.read = seconds, count, []

    def __len__(self):
        return self.count

    def __getitem__(self, k):
        time.sleep(self.seconds)
        self.read.append(k)


@pytest.mark.parametrize("load, compute, passes, most, expected", [
    (0.10, 0.10, 1, 8, 2),   # as slow to read as to compute: 1.25 workers -> 2
    (0.40, 0.10, 1, 8, 5),   # 5 workers keep up with 0.4 s reads at 0.1 s steps
    (0.40, 0.10, 2, 8, 8),   # two batches a step: 10 wanted, 8 cores
    (0.01, 1.00, 1, 8, 1),   # reading is nothing next to compute: one worker still overlaps it
    (0.10, 0.00, 1, 3, 3),   # no compute measured: the most
])
def test_the_count_keeps_the_step_fed_within_the_cores(load, compute, passes, most, expected):
    assert workers.needed(load, compute, passes, most) == expected


def test_auto_reads_with_the_most_then_chooses_from_what_it_measured(monkeypatch):
    monkeypatch.setattr(workers, "cores_per_rank", lambda local_size: 9)
    chosen = workers.LoaderWorkers("auto", local_size=2, passes=1)
    assert chosen.deciding and chosen.count == chosen.most == 8  # one core left to training
    batches = SlowBatches(0.05)
    line = chosen.choose(batches, train_seconds=1.5, data_wait_seconds=0.5, steps=20)  # 0.05 s a step
    assert batches.read == [0, 1]  # two reads timed, in this process
    assert 2 <= chosen.count <= 3 and not chosen.deciding  # 1.25 x 0.05+ / 0.05, with sleep's overshoot
    assert line.startswith(f"data.workers=auto: {chosen.count} loader worker(s)") and "at most 8" in line
    assert chosen.chosen_from["workers"] == chosen.count


def test_a_number_is_kept_and_never_rechosen():
    fixed = workers.LoaderWorkers(3, local_size=1, passes=1)
    assert fixed.count == 3 and not fixed.deciding


def test_the_cores_are_shared_among_the_ranks_on_the_host():
    alone = workers.cores_per_rank(1)
    assert alone >= 1 and workers.cores_per_rank(alone * 4) == 1


@pytest.mark.parametrize("value, expected", [("auto", "auto"), (0, 0), ("4", 4), (2, 2)])
def test_the_setting_reads_auto_or_a_count(value, expected):
    assert config.load(overrides=[f"data.workers={value}"]).data.workers == expected


@pytest.mark.parametrize("value", ["-1", "many", "1.5"])
def test_a_bad_setting_is_one_line_naming_the_key(value):
    with pytest.raises(UserError) as caught:
        config.load(overrides=[f"data.workers={value}"])
    message = str(caught.value)  # 1.5: OmegaConf's own type error, naming the key and the types
    assert "data.workers" in message and "\n" not in message
    assert "auto" in message or "Union[int, str]" in message
