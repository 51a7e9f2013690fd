"""hvdcls.observe.tensorboard writes event files TensorBoard reads, without importing a framework."""
import struct
import subprocess
import sys

import pytest
from tensorboard.compat.proto import event_pb2

from hvdcls.observe.monitor import RunInfo, StepSample
from hvdcls.observe.tensorboard import TensorBoardSink

INFO = RunInfo("torch", "compact_cnn", "digits", 2, epochs=1, steps_per_epoch=3, start_epoch=0)


def read_events(path) -> list:
    """TFRecord framing: u64 length, u32 crc, data, u32 crc."""
    data, events, pos = path.read_bytes(), [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        events.append(event_pb2.Event.FromString(data[pos + 12:pos + 12 + length]))
        pos += 12 + length + 4
    return events


def scalars(events) -> dict:
    return {(v.tag, e.step): v.simple_value for e in events for v in e.summary.value}


def test_step_and_epoch_scalars(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    sink.start(INFO)
    for step, loss in enumerate([2.0, None, 1.5]):
        sink.step(StepSample(0, step, 64, 0.5, 0.5, None, 0.1, loss))
    sink.epoch({"epoch": 1, "train_loss": 1.7, "val_accuracy": 0.8, "allreduce_share": None}, [])
    sink.close()
    [path] = (tmp_path / "tb").glob("events.out.tfevents.*")
    events = read_events(path)
    assert events[0].file_version == "brain.Event:2"
    got = scalars(events)
    assert got[("step/loss", 1)] == 2.0 and got[("step/loss", 3)] == 1.5
    assert ("step/loss", 2) not in got  # that step's loss was not read
    assert got[("step/images_per_sec", 3)] == 128 / 2.0  # two steps since the last write
    assert got[("epoch/train_loss", 1)] == pytest.approx(1.7) and got[("epoch/val_accuracy", 1)] == pytest.approx(0.8)
    assert not any(tag == "epoch/allreduce_share" for tag, _ in got)  # not measured: not written


def test_writing_imports_no_framework(tmp_path):
    code = ("import sys\nfrom pathlib import Path\nfrom hvdcls.observe.tensorboard import ScalarWriter\n"
            f"w = ScalarWriter(Path({str(tmp_path)!r}))\nw.add({{'a': 1.0}}, 1)\nw.close()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tensorflow', 'keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
