"""`hvdcls export RUN_DIR --format FORMAT -o PATH`: a run's model for inference elsewhere.

    hvdcls export runs/pets --format onnx -o pets.onnx              # torch or tensorflow runs
    hvdcls export runs/pets --format torchscript -o pets.pt         # torch: state-dict, torchscript
    hvdcls export runs/pets-tf --format savedmodel -o pets-saved/   # tensorflow: keras, savedmodel

The backend writes the export (the EMA's weights when the run kept one) with the run's class
names and preprocessing, loads what it wrote and compares its outputs with the framework's on
one batch (a few images of the run's validation split, preprocessed as evaluation does; random
inputs when that data is gone): a difference above 1e-4 is an error. It writes under a hidden
name beside PATH (with any file it writes beside that, such as a .pth's PATH.json card),
renamed into place only once checked, so an existing PATH is replaced only by an export that
passed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from hvdcls import registry
from hvdcls.data import datasets
from hvdcls.errors import EXIT_OK, UserError
from hvdcls.inference.contract import DIRECTORY_FORMATS
from hvdcls.inference.images import eval_preprocess
from hvdcls.inference.run import RunModel, open_run

SAMPLE_IMAGES = 4  # the batch an export is checked on
# Formats whose writer insists on a file name ending (Keras' model.save)
REQUIRED_SUFFIXES = {"keras": ".keras"}
# What an earlier export of a directory format holds: only such a directory (or an empty one)
# is replaced, never a directory the user meant to write into.
EXPORT_MARKERS = {"savedmodel": "saved_model.pb"}


def main(args: argparse.Namespace) -> int:
    """The command: the export renamed into place and one line about it; UserError for bad
    input or an export whose outputs differ from the framework's."""
    run = open_run(args.run, "RUN_DIR")
    backend = registry.load(run.backend, "inference")
    fmt, output = args.format, Path(args.output)
    check_format(fmt, output, run.backend, tuple(backend.EXPORT_FORMATS))
    model = backend.load(run)
    sample, origin = sample_batch(run)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.parent / f".tmp-{os.getpid()}-{output.name}"  # the name's suffix kept, for the writers
    try:
        report = model.export(fmt, tmp, sample)
        for companion in companions(tmp):  # a file written beside it: PATH.json, say
            move_into_place(companion, output.parent / companion.name.replace(tmp.name, output.name, 1))
        move_into_place(tmp, output)
    finally:
        for leftover in [tmp, *companions(tmp)]:
            remove(leftover)
    print(f"{fmt}: {output} ({size_text(disk_bytes(output))}), max abs diff "
          f"{float(report['max_abs_diff']):.1e} against {run.backend} on {origin}")
    return EXIT_OK


def check_format(fmt: str, output: Path, backend: str, formats: tuple[str, ...]) -> None:
    if fmt not in formats:
        raise UserError(f"--format {fmt}: the {backend} backend exports {', '.join(formats)}")
    suffix = REQUIRED_SUFFIXES.get(fmt)
    if suffix and not output.name.endswith(suffix):
        raise UserError(f"--format {fmt} writes a {suffix} file: name it so (-o {output.stem}{suffix})")
    if output.is_dir() and fmt not in DIRECTORY_FORMATS:
        raise UserError(f"-o {output} is a directory: name the file --format {fmt} writes")
    if output.is_dir() and any(output.iterdir()) and not (output / EXPORT_MARKERS.get(fmt, "")).is_file():
        raise UserError(f"-o {output} is a directory that holds no {fmt} export: it is not replaced "
                        "(name a new or empty directory)")


def sample_batch(run: RunModel) -> tuple[np.ndarray, str]:
    """A few images of the run's validation split, preprocessed as evaluation does; random
    normal inputs (said on stderr) when the data cannot be read any more."""
    preprocess = eval_preprocess(run.card, run.config.data)
    try:
        val = datasets.open_data(run.config).val
        count = min(SAMPLE_IMAGES, len(val))
        images = np.stack([preprocess.eval(val.image(i)) for i in range(count)])
        return images, f"{count} images of the run's validation split"
    except (UserError, OSError) as err:
        print(f"hvdcls: warning: the run's data cannot be read ({err}): checking the export "
              "on random inputs", file=sys.stderr)
    side = run.card.image_size
    images = np.random.default_rng(0).standard_normal((SAMPLE_IMAGES, side, side, 3), np.float32)
    return images, f"{SAMPLE_IMAGES} random inputs"


def companions(tmp: Path) -> list[Path]:
    """Files an exporter wrote beside `tmp` under its name and more (a .pth's PATH.json card):
    they go into place with it, under the output's name and the same ending."""
    return sorted(p for p in tmp.parent.iterdir() if p.name.startswith(tmp.name) and p.name != tmp.name)


def move_into_place(tmp: Path, output: Path) -> None:
    """Rename the checked export over `output`. A file replaces a file atomically; where a
    directory is involved (savedmodel, or a file where one was), the old one is set aside
    first and removed once the new one is in place."""
    if output.exists() and (output.is_dir() or tmp.is_dir()):
        old = output.parent / f".old-{os.getpid()}-{output.name}"
        os.replace(output, old)
        os.replace(tmp, output)
        remove(old)
    else:
        os.replace(tmp, output)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def disk_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size


def size_text(size: int) -> str:
    for power, unit in ((3, "GB"), (2, "MB"), (1, "KB")):
        if size >= 1000 ** power:
            return f"{size / 1000 ** power:.1f} {unit}"
    return f"{size} B"
