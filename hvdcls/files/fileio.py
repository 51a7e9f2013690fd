"""Writing outputs so that a crash never leaves a half-written file behind."""
from __future__ import annotations

import io
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterator, Mapping

if TYPE_CHECKING:  # numpy and zipfile are imported where used: hvdcls-horovodrun starts without them
    import numpy as np


def write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over `path`.
    `durable=False` skips the fsync: a reader still never sees a torn file (the rename is
    atomic), but after a power failure the file may be older or empty; for files rewritten
    every second whose next version is on its way (status.json), where an fsync costs
    milliseconds each time (3 ms on the test machine's disk, more on a network file system)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are ordinary files
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path: Path, obj, durable: bool = True) -> None:
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), durable)


def read_jsonl(path: Path) -> list:
    """One JSON value per non-blank line (metrics.jsonl: a run's epochs). OSError when the file
    cannot be read, ValueError for a line that is not JSON: a file written by write_atomic is
    never torn, so a bad line is a damaged file, for the caller to name."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def savez_one_at_a_time(handle: BinaryIO, arrays: Mapping[str, "np.ndarray | Callable[[], np.ndarray]"]) -> None:
    """np.savez's file (np.load reads it), but an array given as a function (a variable's
    `.numpy`) is made, written and dropped before the next is made: savez takes them all at
    once, so a checkpoint of a model's variables held a host copy of every one of them (2.5 GB
    for ViT-H/14) on top of the model while it wrote."""
    import zipfile

    import numpy as np

    with zipfile.ZipFile(handle, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, make in arrays.items():
            with archive.open(f"{name}.npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(make() if callable(make) else make),
                                          allow_pickle=False)


# How much a large output may hold in the page cache before it is synced and dropped from it.
DROP_EVERY_BYTES = 256 << 20


class _SyncingFile(io.FileIO):
    """A file opened for writing whose written pages are synced to disk and dropped from the
    page cache every `every` bytes. The page cache of a memory cgroup (a Slurm job, a container,
    a service run) is charged to it, and cgroup v1 does not throttle dirty pages per group: a
    ViT-H/14 checkpoint (2.5 GB of weights, 2.5 GB of optimizer slices a rank) is written in
    seconds by ranks that hold 21 of a 22 GB limit, and dirty pages are freed only once
    written back; this keeps their share of the limit bounded."""

    def __init__(self, path: Path, every: int):
        super().__init__(path, "wb")
        self.every, self.pending = every, 0

    def write(self, data) -> int:
        written = super().write(data) or 0
        self.pending += written
        if self.pending >= self.every:
            self.sync_and_drop()
        return written

    def sync_and_drop(self) -> None:
        os.fsync(self.fileno())
        if hasattr(os, "posix_fadvise"):  # Linux; elsewhere the pages stay cached, still synced
            os.posix_fadvise(self.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        self.pending = 0


@contextmanager
def large_output(path: Path, every: int = DROP_EVERY_BYTES) -> Iterator[BinaryIO]:
    """A buffered binary handle to `path` (created or truncated) for a checkpoint-sized file:
    on disk (fsynced) when the block ends, and never more than `every` bytes of it in the page
    cache on the way. The caller picks the name (a temporary one it renames, or a file in a
    directory that is renamed whole)."""
    raw = _SyncingFile(path, every)
    with io.BufferedWriter(raw, buffer_size=1 << 20) as handle:
        yield handle
        handle.flush()
        raw.sync_and_drop()
