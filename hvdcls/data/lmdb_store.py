"""LMDB data sets: one file holding every image of an ImageFolder, for fast shared reads.

    hvdcls data pack /data/imagenet -o /data/imagenet.lmdb
    hvdcls train --backend torch --data /data/imagenet.lmdb

Layout (version 1): the key `__meta__` holds JSON {format, version, classes, splits:{name: n}};
`__labels__/<split>` holds that split's labels as little-endian int32 (so opening a file of a
million images reads kilobytes, not the images); `<split>/<index, 9 digits>` holds a 4-byte
little-endian label followed by the image file's original bytes (no re-encoding, so packing loses
nothing). The file is written under a temporary name and renamed when complete.
"""
from __future__ import annotations

import json
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hvdcls.config import Config
from hvdcls.data.sources import Data, LabelledSource, imagefolder_splits, open_image_bytes, split_source
from hvdcls.errors import UserError

FORMAT, VERSION = "hvdcls-lmdb", 1
META_KEY = b"__meta__"
LABELS_KEY = "__labels__/{}"
LABEL = struct.Struct("<I")


def record_key(split: str, index: int) -> bytes:
    return f"{split}/{index:09d}".encode()


def _lmdb():
    try:
        import lmdb
    except ImportError:
        raise UserError("LMDB data needs the lmdb package: run `make setup` "
                        "(or `pip install lmdb`)") from None
    return lmdb


def pack(source_dir: Path, out_path: Path, progress: bool = True) -> dict:
    """Write an ImageFolder directory (train/ and optional val/) into one LMDB file."""
    from tqdm import tqdm

    source_dir, out_path = Path(source_dir), Path(out_path)
    if not source_dir.is_dir():
        raise UserError(f"source {source_dir} is not a directory")
    if out_path.exists():
        raise UserError(f"{out_path} already exists: remove it or choose another name")
    splits = imagefolder_splits(source_dir)
    total_bytes = sum(p.stat().st_size for _, paths, _ in splits.values() for p in paths)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    env = _lmdb().open(str(tmp), subdir=False, map_size=int(total_bytes * 1.1) + (64 << 20),
                       lock=False, sync=False)
    meta: dict[str, Any] = {"format": FORMAT, "version": VERSION, "classes": splits["train"][0],
            "splits": {name: len(paths) for name, (_, paths, _) in splits.items()}}
    try:
        with tqdm(total=sum(meta["splits"].values()), unit="img", disable=not progress,
                  desc=f"packing {out_path.name}") as bar:
            for name, (_, paths, labels) in splits.items():
                _write_split(env, name, paths, labels, bar)
        with env.begin(write=True) as txn:
            for name, (_, _, labels) in splits.items():
                txn.put(LABELS_KEY.format(name).encode(), np.asarray(labels, "<i4").tobytes())
            txn.put(META_KEY, json.dumps(meta).encode())
        env.sync(True)
        env.close()
        os.replace(tmp, out_path)
    except BaseException:
        env.close()
        tmp.unlink(missing_ok=True)
        raise
    finally:
        Path(f"{tmp}-lock").unlink(missing_ok=True)
    return meta


def _write_split(env, split: str, paths: list[Path], labels: list[int], bar, chunk: int = 512) -> None:
    for start in range(0, len(paths), chunk):
        with env.begin(write=True) as txn:
            for index in range(start, min(start + chunk, len(paths))):
                data = paths[index].read_bytes()
                txn.put(record_key(split, index), LABEL.pack(labels[index]) + data)
                bar.update(1)


@dataclass
class LMDBSource(LabelledSource):
    """One split of an LMDB file; holds no open handle, so it can go to loader workers."""

    path: Path
    split: str
    labels: np.ndarray

    def _record(self, index: int) -> bytes:
        with open_env(self.path).begin(buffers=False) as txn:
            value = txn.get(record_key(self.split, int(index)))
        if value is None:
            raise UserError(f"{self.path} has no record {record_key(self.split, int(index)).decode()}")
        return value

    def encoded(self, index: int) -> bytes:
        """The image file's original bytes (for decoding elsewhere: hvdcls.data.device_decode)."""
        return self._record(index)[LABEL.size:]

    def image(self, index: int, draft=None):
        return open_image_bytes(self.encoded(index), f"{self.path}:{self.split}/{index}", draft)


_ENVS: dict[tuple[str, int], Any] = {}  # lmdb.Environment
_ENVS_LOCK = threading.Lock()


def open_env(path: Path):
    """One read-only environment per file and process: LMDB refuses a second one in the same
    process. A forked loader worker inherits its parent's environments, which it must not use
    and which block opening its own: it closes its copies first (readonly and lock=False, so
    this releases nothing the parent holds)."""
    pid = os.getpid()
    key = (str(Path(path).resolve()), pid)
    with _ENVS_LOCK:  # tf.data reads from several threads
        for inherited in [k for k in _ENVS if k[1] != pid]:
            _ENVS.pop(inherited).close()
        if key not in _ENVS:
            try:
                _ENVS[key] = _lmdb().open(str(path), subdir=Path(path).is_dir(), readonly=True,
                                          lock=False, readahead=False, max_readers=512)
            except Exception as err:
                raise UserError(f"{path} is neither an ImageFolder directory nor an LMDB file "
                                f"({str(err).splitlines()[0]})") from None
        return _ENVS[key]


def read_meta(path: Path) -> dict:
    with open_env(path).begin() as txn:
        raw = txn.get(META_KEY)
        if raw is None:
            raise UserError(f"{path} is an LMDB file but not one `hvdcls data pack` wrote (no __meta__)")
        meta = json.loads(raw)
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise UserError(f"{path}: unsupported LMDB layout {meta.get('format')} v{meta.get('version')}")
        meta["labels"] = {split: _labels(txn, split, n) for split, n in meta["splits"].items()}
    return meta


def _labels(txn, split: str, count: int) -> np.ndarray:
    raw = txn.get(LABELS_KEY.format(split).encode())
    labels = np.frombuffer(raw or b"", "<i4").astype(np.int64)
    if len(labels) != count:
        raise UserError(f"LMDB labels of split {split!r} are incomplete ({len(labels)} of {count})")
    return labels


def open_lmdb(config: Config, path: Path):
    meta = read_meta(path)
    train = LMDBSource(path, "train", meta["labels"]["train"])
    if "val" in meta["labels"]:
        val = LMDBSource(path, "val", meta["labels"]["val"])
    else:
        train, val = split_source(train, config.data.val_fraction, config.training.seed)
    return Data("lmdb", train, val, list(meta["classes"]),
                {"path": str(path), "train": len(train), "val": len(val)})


def main(source: Path, output: Path, progress: bool = True) -> int:
    """`hvdcls data pack SOURCE -o OUTPUT`."""
    meta = pack(source, output, progress)
    counts = ", ".join(f"{n} {split}" for split, n in meta["splits"].items())
    print(f"wrote {output}: {counts} images, {len(meta['classes'])} classes")
    return 0
