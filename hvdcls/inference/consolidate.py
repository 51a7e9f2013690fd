"""`hvdcls checkpoint consolidate RUN_DIR -o FILE`: a training.zero=3 checkpoint as one unsharded file.

    hvdcls checkpoint consolidate runs/vit-g -o vit-g.safetensors    # torch: model.weights reads it
    hvdcls checkpoint consolidate runs/vit-tf -o vit-tf.npz          # tensorflow: tensorflow.npz's layout

RUN_DIR is a run directory (its newest checkpoint) or one checkpoint, as evaluate and export take
them. Under training.zero=3 each rank wrote its slices of the parameters to its own shard file
and rank 0 the blocks' index (docs/training.md); this reads each parameter from the slices that
hold it, whatever world size wrote them (hvdcls.maths.zero_consolidate), and writes it before
reading the next, under a temporary name renamed into place: no step holds the whole model.
The backend's inference module writes its format (torch_backend/consolidate.py,
tf_backend/consolidate.py). The optimizer's state is not consolidated: a resume reads the shard
files themselves, at any world size. Evaluation, export, predict and model.weights read a
sharded run the same way without this command.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from hvdcls import registry
from hvdcls.errors import EXIT_OK, UserError
from hvdcls.inference.run import open_run


def main(args: argparse.Namespace) -> int:
    output = Path(args.output)
    run = open_run(args.run, "RUN_DIR")
    backend = registry.load(run.backend, "inference")
    suffix = backend.CONSOLIDATED_SUFFIX
    if output.suffix != suffix or output.is_dir():
        raise UserError(f"-o {output}: a {run.backend} run consolidates into a {suffix} file")
    sharded = backend.sharded_run(run)
    if sharded is None:
        raise UserError(f"{run.checkpoint_dir}: not a training.zero=3 checkpoint (it holds the whole model "
                        "already: model.weights, evaluate and export read it as it is)")
    output.parent.mkdir(parents=True, exist_ok=True)
    count = sharded.write(output)
    print(f"{output}: {count} tensors from {sharded.index.world} ranks' shard files of {run.checkpoint_dir} "
          "(the model's; the optimizer's state stays in them)")
    return EXIT_OK
