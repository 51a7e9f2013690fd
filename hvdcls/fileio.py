"""Writing outputs so that a crash never leaves a half-written file behind."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Mapping

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
