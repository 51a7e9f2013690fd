"""hvdcls.training.profiling: which steps are profiled, and the trace directory appears whole."""
from contextlib import contextmanager

import pytest

from hvdcls.training.profiling import StepProfiler, profiled_steps


@pytest.mark.parametrize("steps, wanted, window", [(10, 3, (1, 3)), (3, 3, (0, 3)), (2, 5, (0, 2)),
                                                   (4, 3, (1, 3))])
def test_profiled_steps_skip_the_first_when_there_is_room(steps, wanted, window):
    assert profiled_steps(steps, wanted) == window


def test_the_trace_lands_in_profile_after_the_last_profiled_step(tmp_path):
    seen, notes = [], []

    @contextmanager
    def fake_profiler(directory):
        seen.append(("start", directory.name))
        yield
        (directory / "trace.json").write_text("{}")  # what a backend writes on exit
        seen.append(("stop", directory.name))

    profiler = StepProfiler(fake_profiler, tmp_path, epoch=2, steps_per_epoch=10, wanted=3,
                            note=notes.append)
    for epoch in (2, 3):
        for step in range(10):
            profiler.before_step(epoch, step)
            profiler.after_step(epoch, step)
            if (epoch, step) == (2, 2):
                assert not (tmp_path / "profile").exists()  # not before the trace is complete
    assert seen == [("start", ".profile.tmp"), ("stop", ".profile.tmp")]
    assert (tmp_path / "profile" / "trace.json").is_file()
    assert not (tmp_path / ".profile.tmp").exists()
    assert notes == [f"profile: steps 2-4 of epoch 3 -> {tmp_path / 'profile'}"]
