"""A .safetensors file written a tensor at a time (`hvdcls checkpoint consolidate`'s torch output).

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian length N, N bytes
of JSON ({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
offsets from the end of the header), then the tensors' bytes, row-major, little-endian. Every
shape and dtype is known before any value is, so the header goes first and each tensor's bytes
follow as it is made and dropped: the file never needs the whole model in memory, as
safetensors' own save_file does. The header is padded with spaces to a multiple of 8 bytes, as
safetensors writes it, so that each tensor can be memory-mapped aligned. Written under a
temporary name beside the target and renamed into place once whole.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from hvdcls.files import fileio

# numpy's dtype names -> safetensors' ("bfloat16": what a caller names a torch bfloat16's bytes)
DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
          "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str  # one of DTYPES' keys
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = ITEM_BYTES[DTYPES[self.dtype]]
        for d in self.shape:
            n *= d
        return n


def header(entries: list[Entry], metadata: dict[str, str]) -> bytes:
    """The length prefix and the JSON header, padded to a multiple of 8."""
    table: dict = {"__metadata__": dict(metadata)} if metadata else {}
    at = 0
    for entry in entries:
        table[entry.name] = {"dtype": DTYPES[entry.dtype], "shape": list(entry.shape),
                             "data_offsets": [at, at + entry.nbytes]}
        at += entry.nbytes
    text = json.dumps(table, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write(path: Path, entries: list[Entry], data: Callable[[Entry], Iterable[Any]],
          metadata: dict[str, str] | None = None) -> None:
    """`entries` in order, each one's bytes from data(entry) (any number of bytes-like chunks, made
    as they are written); a chunk count that does not add up to the entry's size is a ValueError, and
    nothing is left at `path`."""
    path = Path(path)
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError("safetensors: a tensor name twice")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with fileio.large_output(tmp) as handle:
            handle.write(header(entries, metadata or {}))
            for entry in entries:
                written = 0
                for chunk in data(entry):
                    written += handle.write(chunk)
                if written != entry.nbytes:
                    raise ValueError(f"safetensors: {entry.name} {entry.shape} {entry.dtype}: {written} bytes "
                                     f"written, {entry.nbytes} expected")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
