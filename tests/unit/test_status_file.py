"""RUN_DIR/status.json: read as hvdcls serve reads it (a missing, a half-written, an older
and a newer file), and written by rank 0's StatusSink (at once on each phase, at most every
interval for steps; nothing on a handover; taken over by a new rank 0)."""
import json

from hvdcls.files import status_file
from hvdcls.files.status_file import RunStatus
from hvdcls.observe.monitor import RunInfo, StepSample
from hvdcls.observe.status import StatusSink


def written(tmp_path, **fields) -> str:
    text = json.dumps(RunStatus(**fields).as_dict())
    (tmp_path / status_file.STATUS_FILE).write_text(text)
    return text


def test_a_missing_or_half_written_status_reads_as_none(tmp_path):
    assert status_file.read(tmp_path) is None
    text = written(tmp_path, phase="training", epoch=2, fraction=0.5, last_step_at=10.0)
    assert status_file.read(tmp_path).epoch == 2
    for part in (text[:len(text) // 2], "", "[1, 2]", '{"epoch": 2}', '{"phase": 3}'):
        (tmp_path / status_file.STATUS_FILE).write_text(part)
        assert status_file.read(tmp_path) is None, part


def test_an_older_or_newer_writers_status_reads_with_what_it_has(tmp_path):
    (tmp_path / status_file.STATUS_FILE).write_text(json.dumps({"phase": "training", "epoch": 1, "new_key": 7}))
    old = status_file.read(tmp_path)
    assert (old.phase, old.epoch, old.hosts, old.endpoint, old.epochs_done) == ("training", 1, None, None, 0)
    assert old.progress is None  # no fraction: nothing to show
    assert old.last_sign_of_life is None


def test_progress_and_the_last_sign_of_life():
    status = RunStatus(phase="evaluating", phase_since=50.0, last_step_at=40.0, epoch=2, epochs=3, step=10,
                       steps_per_epoch=10, fraction=2 / 3)
    assert status.progress == {"epoch": 2, "epochs": 3, "step": 10, "steps_per_epoch": 10, "fraction": 2 / 3}
    assert status.last_sign_of_life == 50.0  # evaluating since after its last step: not silent


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def sink(tmp_path, writes, clock, **kwargs) -> StatusSink:
    return StatusSink(tmp_path, "torch", "node1:9400", clock=clock, interval=1.0,
                      write=lambda path, obj: writes.append(dict(obj)), **kwargs)


def sample(epoch, step) -> StepSample:
    return StepSample(epoch, step, images=64, seconds=0.1, data_wait=0.0, allreduce=None, lr=0.1, loss=None)


def test_steps_are_written_at_most_every_interval_and_phases_at_once(tmp_path):
    writes, clock = [], Clock()
    status = sink(tmp_path, writes, clock)
    assert [w["phase"] for w in writes] == ["starting"] and writes[0]["endpoint"] == "node1:9400"
    status.start(RunInfo("torch", "compact_cnn", "digits", 4, epochs=2, steps_per_epoch=10, start_epoch=0,
                         hosts={"node1": 2, "node2": 2}))
    assert writes[-1]["hosts"] == {"node1": 2, "node2": 2} and writes[-1]["world_size"] == 4
    for step in range(10):  # 10 steps in 1.25 s: the first (a phase change) and the one a second later
        clock.now += 0.125
        status.step(sample(0, step))
    assert [w["phase"] for w in writes] == ["starting", "starting", "training", "training"]
    assert (writes[-1]["step"], writes[-1]["last_step_at"]) == (9, clock.now - 0.125)
    status.phase("evaluating")
    status.epoch({"epoch": 1, "val_accuracy": 0.9}, [])
    assert writes[-2]["phase"] == "evaluating" and writes[-1]["metrics"] == {"epoch": 1, "val_accuracy": 0.9}
    assert writes[-1]["fraction"] == 0.5 and writes[-1]["epochs_done"] == 1
    clock.now += 0.125
    status.step(sample(1, 0))  # back to training: at once
    assert writes[-1]["phase"] == "training" and writes[-1]["phase_since"] == clock.now
    count = len(writes)
    status.close()  # a handover: the new rank 0's file is not overwritten
    assert len(writes) == count
    status.finish()
    assert (writes[-1]["phase"], writes[-1]["fraction"]) == ("done", 1.0)
    status.failed("rank 1: out of memory")
    assert (writes[-1]["phase"], writes[-1]["error"]) == ("failed", "rank 1: out of memory")


def test_a_new_rank_zero_takes_the_file_over(tmp_path):
    clock = Clock()
    first = StatusSink(tmp_path, "torch", "node2:9400", clock=clock)
    first.epoch({"epoch": 1, "val_accuracy": 0.8}, [])
    taken = StatusSink(tmp_path, "torch", "node1:9400", phase="resetting", clock=clock)
    found = status_file.read(tmp_path)
    assert (found.phase, found.endpoint, found.metrics, found.epochs_done) == (
        "resetting", "node1:9400", {"epoch": 1, "val_accuracy": 0.8}, 1)
    taken.start(RunInfo("torch", "compact_cnn", "digits", 2, epochs=3, steps_per_epoch=20, start_epoch=1,
                        hosts={"node1": 2}))
    found = status_file.read(tmp_path)
    assert (found.world_size, found.hosts, found.epoch, found.fraction) == (2, {"node1": 2}, 2, 1 / 3)


def test_a_run_resumed_with_nothing_left_to_train_reports_its_checkpoints_last_epoch(tmp_path):
    writes, clock = [], Clock()
    status = sink(tmp_path, writes, clock)  # the service requeued it after its last checkpoint
    last = {"epoch": 3, "val_accuracy": 0.91}
    status.start(RunInfo("torch", "compact_cnn", "digits", 2, epochs=3, steps_per_epoch=20, start_epoch=3,
                         last_epoch=last))
    status.finish()
    assert (writes[-1]["phase"], writes[-1]["metrics"], writes[-1]["epochs_done"]) == ("done", last, 3)
    fresh = sink(tmp_path, writes, clock)
    fresh.start(RunInfo("torch", "compact_cnn", "digits", 2, epochs=3, steps_per_epoch=20, start_epoch=0))
    assert writes[-1]["metrics"] is None


def test_a_full_disk_costs_the_status_not_the_run(tmp_path, capsys):
    def full(path, obj):
        raise OSError(28, "No space left on device")

    status = StatusSink(tmp_path, "torch", write=full)
    status.phase("evaluating")
    assert capsys.readouterr().err.count("No space left on device") == 1  # said once


def test_only_the_last_status_is_fsynced(tmp_path, monkeypatch):
    import os

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    status = StatusSink(tmp_path, "torch")
    status.phase("evaluating")
    assert synced == [] and status_file.read(tmp_path).phase == "evaluating"
    status.finish()
    assert len(synced) == 1 and status_file.read(tmp_path).phase == "done"
