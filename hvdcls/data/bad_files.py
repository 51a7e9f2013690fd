"""Image files that cannot be decoded: `data.bad_files=fail` (exit 2 naming the file) or `skip`.

Bad files are found where they are read, mid-epoch, by whichever process reads them: the
training process itself, a forked torch DataLoader worker or a tf.data thread. So that a
file is warned about and counted once per rank whichever of these meets it first, each rank
keeps a small directory (made before any worker starts, shared with them) holding one marker
per bad file, created with O_EXCL: the creator warns, everyone else stays quiet.

Skipping keeps every batch full: the unreadable sample's slot is taken by the next readable
sample of the split. A shorter batch would change tensor shapes and an empty one cannot be
trained on; above all every rank keeps the same number of steps, so bad data never stalls
the collectives of the other ranks.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hvdcls.errors import UserError

POLICIES = ("fail", "skip")
FATAL_FILE = "fatal"


class UnreadableImage(UserError):
    """One sample's file cannot be read or decoded; names the file."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, (reason.splitlines() or ["unknown error"])[0]
        super().__init__(f"cannot read image {name}: {self.reason}")


class BadFileLog:
    """This rank's record of bad files, shared with its loader workers through a directory."""

    def __init__(self, policy: str, directory: Optional[Path] = None):
        self.policy = policy
        self.directory = Path(directory or tempfile.mkdtemp(prefix="hvdcls-bad-files-"))
        if directory is None:
            owner = os.getpid()  # forked workers inherit atexit hooks: only the owner removes it
            atexit.register(self._remove_if_owner, owner)

    def _remove_if_owner(self, owner: int) -> None:
        if os.getpid() == owner:
            self.remove()

    def met(self, err: UnreadableImage) -> None:
        """Called for every failed read: raise (fail) or warn the first time (skip)."""
        if self.policy == "fail":
            message = f"{err} (data.bad_files=fail; data.bad_files=skip leaves such files out)"
            self._first(self.directory / FATAL_FILE, message)
            raise UserError(message)
        marker = self.directory / hashlib.sha1(err.name.encode()).hexdigest()
        if self._first(marker, err.name):
            print(f"hvdcls: warning: skipping unreadable image {err.name}: {err.reason} "
                  "(data.bad_files=skip)", file=sys.stderr, flush=True)

    @staticmethod
    def _first(path: Path, text: str) -> bool:
        """Create `path` holding `text` unless it exists; True for the one creator."""
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        return True

    def skipped(self) -> list[str]:
        """Names of the files skipped so far on this rank, sorted."""
        if not self.directory.is_dir():
            return []
        return sorted(p.read_text() for p in self.directory.iterdir() if p.name != FATAL_FILE)

    def fatal(self) -> Optional[str]:
        """The first fail-policy error any process of this rank raised, if one did."""
        path = self.directory / FATAL_FILE
        return path.read_text() if path.is_file() else None

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class CheckedSource:
    """An image source read under the bad-file policy. Everything else is the wrapped one's."""

    inner: Any  # the source read (named so that the wrapped source's own `source` shows through)
    log: BadFileLog
    substitutes: dict = field(default_factory=dict)  # index -> the readable index read instead

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str):
        if name in ("inner", "log", "substitutes"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def label(self, index: int) -> int:
        return self.inner.label(self.substitutes.get(index, index))

    def image(self, index: int, draft=None):
        size = len(self.inner)
        for offset in range(size):
            candidate = (int(index) + offset) % size
            try:
                image = self.inner.image(candidate, draft)
            except UnreadableImage as err:
                self.log.met(err)
                continue
            if candidate != index:
                self.substitutes[index] = candidate
            return image
        raise UserError(f"no image of this split can be read ({size} files, all skipped)")


def summarise(policy: str, per_rank: list[list[str]], listed: int = 100) -> dict:
    """summary.json's `bad_files`: the union over ranks (a file can be met by several)."""
    files = sorted(set().union(*per_rank)) if per_rank else []
    return {"policy": policy, "skipped": len(files), "files": files[:listed]}
