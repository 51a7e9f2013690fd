"""Writing outputs so that a crash never leaves a half-written file behind."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are ordinary files
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path: Path, obj) -> None:
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_jsonl(path: Path) -> list:
    """One JSON value per non-blank line (metrics.jsonl: a run's epochs). OSError when the file
    cannot be read, ValueError for a line that is not JSON: a file written by write_atomic is
    never torn, so a bad line is a damaged file, for the caller to name."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
