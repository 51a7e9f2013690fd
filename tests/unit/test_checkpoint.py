"""hvdcls.training.checkpoint: atomic epoch directories, pruning, --resume resolution, cadence."""
import json
import os
from pathlib import Path

import pytest

from hvdcls.errors import UserError
from hvdcls.maths.zero import shard_glob
from hvdcls.training import checkpoint


def writer(payload: bytes = b"weights"):
    def write(directory: Path) -> None:
        (directory / "model.bin").write_bytes(payload)
        (directory / "optim").mkdir()
        (directory / "optim" / "state.bin").write_bytes(payload[::-1])
    return write


def state(epoch: int, backend: str = "torch") -> dict:
    return {"backend": backend, "epoch": epoch, "global_step": epoch * 10, "history": [{"epoch": epoch}]}


def save(run: Path, epoch: int, keep: int = 2, write=None, backend="torch") -> Path:
    return checkpoint.save(run / "checkpoints", epoch, state(epoch, backend),
                           write or writer(f"w{epoch}".encode()), keep)


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_checkpoint_name():
    assert checkpoint.checkpoint_name(3) == "epoch-0003"
    assert checkpoint.checkpoint_name(120) == "epoch-0120"


def test_save_writes_state_and_backend_files(tmp_path):
    path = save(tmp_path / "run", 3)
    assert path == tmp_path / "run" / "checkpoints" / "epoch-0003"
    assert listing(path) == ["model.bin", "optim", "state.json"]
    assert (path / "model.bin").read_bytes() == b"w3"
    assert (path / "optim" / "state.bin").read_bytes() == b"3w"
    assert json.loads((path / "state.json").read_text()) == state(3)
    assert listing(path.parent) == ["epoch-0003"]  # no temporary directory left behind


def test_keep_prunes_the_oldest(tmp_path):
    run = tmp_path / "run"
    for epoch in (1, 2, 3, 4):
        save(run, epoch, keep=2)
    assert listing(run / "checkpoints") == ["epoch-0003", "epoch-0004"]
    save(run, 5, keep=1)
    assert listing(run / "checkpoints") == ["epoch-0005"]
    assert checkpoint.list_checkpoints(run / "checkpoints") == [run / "checkpoints" / "epoch-0005"]


def test_keep_larger_than_count_keeps_all(tmp_path):
    run = tmp_path / "run"
    for epoch in (1, 2):
        save(run, epoch, keep=5)
    assert listing(run / "checkpoints") == ["epoch-0001", "epoch-0002"]


def test_saving_an_epoch_again_replaces_it(tmp_path):
    run = tmp_path / "run"
    save(run, 2, write=writer(b"old"))
    save(run, 2, write=writer(b"new"))
    assert listing(run / "checkpoints") == ["epoch-0002"]
    assert (run / "checkpoints" / "epoch-0002" / "model.bin").read_bytes() == b"new"


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_failing_writer_leaves_previous_checkpoint(tmp_path, error):
    run = tmp_path / "run"
    save(run, 1)

    def broken(directory: Path) -> None:
        (directory / "model.bin").write_bytes(b"half")
        raise error

    with pytest.raises(type(error)):
        save(run, 2, write=broken)
    assert listing(run / "checkpoints") == ["epoch-0001"]  # no epoch-0002, no hidden temp dir
    assert (run / "checkpoints" / "epoch-0001" / "model.bin").read_bytes() == b"w1"
    assert json.loads((run / "checkpoints" / "epoch-0001" / "state.json").read_text()) == state(1)
    assert checkpoint.resolve(run) == run / "checkpoints" / "epoch-0001"


def test_failing_rewrite_keeps_the_old_copy_of_that_epoch(tmp_path):
    run = tmp_path / "run"
    save(run, 2)

    def broken(directory: Path) -> None:
        raise OSError("no space")

    with pytest.raises(OSError):
        save(run, 2, write=broken)
    assert listing(run / "checkpoints") == ["epoch-0002"]
    assert (run / "checkpoints" / "epoch-0002" / "model.bin").read_bytes() == b"w2"


def test_unserialisable_state_leaves_nothing(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(TypeError):
        checkpoint.save(run / "checkpoints", 1, {"backend": "torch", "bad": object()}, writer(), 2)
    assert listing(run / "checkpoints") == []


def test_list_checkpoints_skips_incomplete_and_foreign(tmp_path):
    ckpts = tmp_path / "checkpoints"
    save(tmp_path, 1)
    (ckpts / "epoch-0009").mkdir()  # no state.json: incomplete
    (ckpts / ".epoch-0010.tmp-1").mkdir()
    (ckpts / ".epoch-0010.tmp-1" / "state.json").write_text("{}")
    (ckpts / "notes").mkdir()
    (ckpts / "notes" / "state.json").write_text("{}")
    assert checkpoint.list_checkpoints(ckpts) == [ckpts / "epoch-0001"]
    assert checkpoint.list_checkpoints(tmp_path / "missing") == []


def test_resolve(tmp_path):
    run = tmp_path / "run"
    for epoch in (1, 2, 3):
        save(run, epoch, keep=5)
    newest = run / "checkpoints" / "epoch-0003"
    assert checkpoint.resolve(run) == newest
    assert checkpoint.resolve(run / "checkpoints") == newest
    assert checkpoint.resolve(run / "checkpoints" / "epoch-0001") == run / "checkpoints" / "epoch-0001"
    assert checkpoint.resolve(str(newest)) == newest


def test_resolve_missing_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(UserError) as info:
        checkpoint.resolve(missing)
    assert str(info.value) == f"--resume {missing}: no such file or directory"


@pytest.mark.parametrize("make", ["empty", "empty_checkpoints", "incomplete"])
def test_resolve_no_checkpoint(tmp_path, make):
    run = tmp_path / "run"
    run.mkdir()
    if make != "empty":
        (run / "checkpoints").mkdir()
    if make == "incomplete":
        (run / "checkpoints" / "epoch-0001").mkdir()
    with pytest.raises(UserError) as info:
        checkpoint.resolve(run)
    assert str(info.value) == f"--resume {run}: no checkpoint there (expected epoch-NNNN/state.json)"


def test_read_state(tmp_path):
    path = save(tmp_path, 4, backend="tensorflow")
    resumed = checkpoint.read_state(path, "tensorflow")
    assert resumed.directory == path and resumed.state == state(4, "tensorflow")


def test_read_state_rejects_another_backend(tmp_path):
    path = save(tmp_path, 4, backend="tensorflow")
    with pytest.raises(UserError) as info:
        checkpoint.read_state(path, "torch")
    assert str(info.value) == f"checkpoint {path} was written by backend 'tensorflow', not 'torch'"


@pytest.mark.parametrize("content", [None, "{not json", ""])
def test_read_state_unreadable(tmp_path, content):
    directory = tmp_path / "epoch-0001"
    directory.mkdir()
    if content is not None:
        (directory / "state.json").write_text(content)
    with pytest.raises(UserError, match=f"checkpoint {directory} is unreadable"):
        checkpoint.read_state(directory, "torch")


@pytest.mark.parametrize("epochs, every, expected", [
    (10, 1, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
    (10, 3, [3, 6, 9, 10]),
    (10, 5, [5, 10]),
    (10, 0, [10]),
    (3, 4, [3]),
    (1, 0, [1]),
])
def test_due(epochs, every, expected):
    assert [e for e in range(1, epochs + 1) if checkpoint.due(e, epochs, every)] == expected


def test_run_dir_of(tmp_path):
    assert checkpoint.run_dir_of(tmp_path / "run" / "checkpoints" / "epoch-0002") == tmp_path / "run"
    assert checkpoint.run_dir_of(tmp_path / "elsewhere" / "epoch-0002") is None
    assert checkpoint.run_dir_of(None) is None


def test_a_killed_writers_temporary_directory_is_hidden_then_removed(tmp_path):
    run = tmp_path / "run"
    save(run, 1)
    leftover = run / "checkpoints" / ".epoch-0002.tmp-99999"  # a writer SIGKILLed mid-write
    leftover.mkdir()
    (leftover / "model.bin").write_bytes(b"half")
    assert checkpoint.list_checkpoints(run / "checkpoints") == [run / "checkpoints" / "epoch-0001"]
    assert checkpoint.resolve(run) == run / "checkpoints" / "epoch-0001"
    save(run, 2)
    assert listing(run / "checkpoints") == ["epoch-0001", "epoch-0002"]


@pytest.mark.parametrize("keep, kept", [(2, ["epoch-0002", "epoch-0003"]), (0, ["epoch-0001", "epoch-0002", "epoch-0003"])])
def test_a_host_copy_keeps_what_rank_0_keeps(tmp_path, keep, kept):
    """A rank on a host that cannot see rank 0's directory writes its shard into its own copy of
    the checkpoint's directory, dropping its older copies as rank 0's commit() drops checkpoints."""
    directory = tmp_path / "checkpoints"
    for epoch in (1, 2, 3):
        path = checkpoint.host_copy(directory, epoch, keep)
        assert path == directory / checkpoint.checkpoint_name(epoch) and path.is_dir()
        (path / "zero-shard-00001-of-00002.pt").touch()
    assert sorted(p.name for p in directory.iterdir()) == kept
    assert checkpoint.list_checkpoints(directory) == []  # never a checkpoint here: no state.json


def test_rank_0_adopts_the_shards_written_beside_its_directory_since_its_marker(tmp_path):
    """A rank that judged rank 0's temporary directory unseen, on rank 0's filesystem after all,
    wrote its shard into the checkpoint's own directory: commit() would replace that directory,
    so rank 0 moves such shards in first; an older save's shard, or one of another world size,
    stays out."""
    directory = tmp_path / "checkpoints"
    stale = checkpoint.host_copy(directory, 3, keep=2) / "zero-shard-00002-of-00003.pt"
    stale.touch()
    os.utime(stale, (1, 1))
    tmp = checkpoint.begin(directory, 3)
    checkpoint.mark_shared(tmp)
    (tmp / "zero-shard-00000-of-00003.pt").write_text("rank 0")
    late = directory / "epoch-0003"
    (late / "zero-shard-00001-of-00003.pt").write_text("rank 1")
    (late / "zero-shard-00001-of-00002.pt").write_text("another world size")
    assert checkpoint.adopt(tmp, 3, shard_glob(3)) == ["zero-shard-00001-of-00003.pt"]
    final = checkpoint.commit(tmp, 3, {"epoch": 3}, lambda d: None, keep=2)
    assert sorted(p.name for p in final.glob("zero-*")) == ["zero-shard-00000-of-00003.pt",
                                                           "zero-shard-00001-of-00003.pt"]
    assert checkpoint.adopt(checkpoint.begin(directory, 4), 4, "zero-*") == []  # nothing beside it
