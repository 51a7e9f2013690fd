"""Checkpoints: one directory per saved epoch, written whole or not at all.

    RUN_DIR/checkpoints/epoch-0003/  state.json + the backend's files (model, optimizer)

Rank 0 writes into a hidden temporary directory beside it and renames it into place, so a
process killed mid-write leaves the previous checkpoint as the latest one. `state.json` holds
what the core needs to continue: the epoch, the step count, the metrics so far and the seeds.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from hvdcls.errors import UserError
from hvdcls.files.fileio import write_json_atomic
from hvdcls.training import faults

STATE_FILE = "state.json"
PREFIX = "epoch-"
TMP_PREFIX = "."  # hidden: never listed as a checkpoint


def checkpoint_name(epoch: int) -> str:
    return f"{PREFIX}{epoch:04d}"


def due(epoch: int, epochs: int, every: int) -> bool:
    """Save after `epoch` (1-based count of finished epochs)? Always after the last one."""
    return epoch == epochs or (every > 0 and epoch % every == 0)


def save(checkpoints_dir: Path, epoch: int, state: dict, write_backend: Callable[[Path], None],
         keep: int) -> Path:
    """Write checkpoint `epoch` atomically, then drop all but the newest `keep`."""
    return commit(begin(checkpoints_dir, epoch), epoch, state, write_backend, keep)


def begin(checkpoints_dir: Path, epoch: int) -> Path:
    """Rank 0: the hidden temporary directory checkpoint `epoch` is written into; commit()
    renames it into place. Other ranks may write their own files there first (training.zero's
    shards), once each has shown that it sees the directory (mark_shared() and sees())."""
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    remove_leftovers(checkpoints_dir)
    tmp = checkpoints_dir / f"{TMP_PREFIX}{checkpoint_name(epoch)}.tmp-{os.getpid()}"
    tmp.mkdir()
    return tmp


def commit(tmp: Path, epoch: int, state: dict, write_backend: Callable[[Path], None], keep: int) -> Path:
    """Rank 0: the backend's files and state.json into `tmp` (from begin()), renamed into place."""
    checkpoints_dir = tmp.parent
    final = checkpoints_dir / checkpoint_name(epoch)
    try:
        (tmp / SHARED_MARKER).unlink(missing_ok=True)
        write_backend(tmp)
        faults.checkpoint_point(epoch, tmp)  # inert outside tests: a kill mid-write
        write_json_atomic(tmp / STATE_FILE, state)
        _fsync_dir(tmp)
        if final.exists():  # re-running an epoch after a resume: replace the old one
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(checkpoints_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(checkpoints_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


# Whether every rank sees rank 0's temporary directory (one filesystem, as on one machine or
# an NFS-mounted run directory): rank 0 leaves a random token in it, and each rank reads it.
SHARED_MARKER = ".shared"


def mark_shared(tmp: Path) -> str:
    token = secrets.token_hex(16)
    (tmp / SHARED_MARKER).write_text(token)
    return token


def sees(tmp: Optional[str], token: Optional[str]) -> bool:
    if tmp is None or token is None:
        return False
    try:
        return (Path(tmp) / SHARED_MARKER).read_text() == token
    except OSError:
        return False


def adopt(tmp: Path, epoch: int, pattern: str) -> list[str]:
    """Rank 0, before commit(): files matching `pattern` that ranks which did not see `tmp` wrote
    into their copy of checkpoint `epoch`'s directory, where that copy is on rank 0's filesystem
    after all (one that showed them `tmp` late), are moved into `tmp`, so that commit()'s
    replacing the directory keeps them. Only files written since `tmp`'s marker count: an older
    save's file left there is not taken for this one's. The names moved."""
    final = tmp.parent / checkpoint_name(epoch)
    marker = tmp / SHARED_MARKER
    if not final.is_dir() or not marker.is_file():
        return []
    since = marker.stat().st_mtime
    moved = []
    for path in sorted(final.glob(pattern)):
        if not (tmp / path.name).exists() and path.stat().st_mtime >= since:
            os.replace(path, tmp / path.name)
            moved.append(path.name)
    return moved


def host_copy(checkpoints_dir: Path, epoch: int, keep: int) -> Path:
    """A rank that cannot see rank 0's temporary directory (its host shares no filesystem with
    rank 0's): this host's own directory of checkpoint `epoch`'s name, where it writes its
    training.zero shard. The rest of the checkpoint (state.json, the other hosts' shards) lies
    on the other hosts, so it is never listed here as a checkpoint; the copies older than the
    newest `keep` go first (0 keeps all), as rank 0's commit() drops its old checkpoints."""
    final = checkpoints_dir / checkpoint_name(epoch)
    if keep > 0 and checkpoints_dir.is_dir():
        older = sorted(p for p in checkpoints_dir.glob(f"{PREFIX}*") if p.is_dir() and p.name < final.name)
        for old in older[:max(0, len(older) - (keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    final.mkdir(parents=True, exist_ok=True)
    return final


def remove_leftovers(checkpoints_dir: Path) -> None:
    """Temporary directories of writers that were killed mid-write: rank 0 is the only writer
    of a run directory, so any still there when it starts a write belongs to a dead process."""
    for leftover in checkpoints_dir.glob(f"{TMP_PREFIX}{PREFIX}*.tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary directories are hidden and skipped)."""
    if not checkpoints_dir.is_dir():
        return []
    found = [p for p in checkpoints_dir.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def resolve(path: Path) -> Path:
    """A checkpoint directory from what the user passed to --resume: the checkpoint itself,
    a run directory or its checkpoints/ directory (then the newest one)."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    for candidate in (path / "checkpoints", path):
        found = list_checkpoints(candidate)
        if found:
            return found[-1]
    if not path.exists():
        raise UserError(f"--resume {path}: no such file or directory")
    raise UserError(f"--resume {path}: no checkpoint there (expected {PREFIX}NNNN/{STATE_FILE})")


@dataclass
class Resumed:
    directory: Path
    state: dict


def read_state(directory: Path, backend: str) -> Resumed:
    try:
        state = json.loads((directory / STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"checkpoint {directory} is unreadable: {err}") from None
    if state.get("backend") != backend:
        raise UserError(f"checkpoint {directory} was written by backend {state.get('backend')!r}, "
                        f"not {backend!r}")
    return Resumed(directory, state)


def run_dir_of(checkpoint_dir: Optional[Path]) -> Optional[Path]:
    """RUN_DIR for RUN_DIR/checkpoints/epoch-N, so a resumed run keeps writing there."""
    if checkpoint_dir is not None and checkpoint_dir.parent.name == "checkpoints":
        return checkpoint_dir.parent.parent
    return None
