#!/bin/sh
# Issue 26's first target after the digits cache (a616c53), torchvision's lazy import (a14cd84)
# and status.json without fsync (584f535): hvdcls against DDP at np=2, and one process of hvdcls
# at the same global batch. First as shipped (the bench fills the cache before its clock), then
# with HVDCLS_CACHE on a path nothing can write, so every rank imports scikit-learn for the
# digits as before a616c53 (DDP's cells are the same code in both runs: the drift anchor).
# Run from the repository root on an otherwise idle machine (~6 min each).
set -eu
OUT=${OUT:-benchmarks/results/2026-12-04-to-accuracy-cache}
run() {
    .venv/bin/hvdcls bench --to-accuracy 0.9 --backends torch --np 1 2 --batch-size 16 32 --runs 5 \
        --max-epochs 6 --runners hvdcls ddp --quiet --output-dir "$@"
}
uptime
run "$OUT/cached"
HVDCLS_CACHE=/proc/hvdcls-no-cache run "$OUT/uncached"
uptime
# The run above without any cache also lost hvdcls-horovodrun's (its build probe ran at every
# launch, ~1.6 s). So again at np=2 with that cache kept and only the digits' missing (a
# directory in the digits file's place: reading and writing it fail), then as shipped.
NC=$(mktemp -d)
cp "${HVDCLS_CACHE:-$HOME/.cache/hvdcls}"/horovod-controllers-*.json "$NC"/
mkdir "$NC/digits-sklearn-$(.venv/bin/python -c 'from importlib.metadata import version; print(version("scikit-learn"))').npz"
run2() {
    .venv/bin/hvdcls bench --to-accuracy 0.9 --backends torch --np 2 --batch-size 16 --runs 5 \
        --max-epochs 6 --runners hvdcls ddp --quiet --output-dir "$@"
}
HVDCLS_CACHE=$NC run2 "$OUT/np2-digits-uncached"
run2 "$OUT/np2-cached"
rm -r "$NC"
# TensorFlow beside a plain Keras fit (one process at each cell's global batch), as shipped.
.venv/bin/hvdcls bench --to-accuracy 0.9 --backends tensorflow --np 1 2 --batch-size 16 --runs 5 \
    --max-epochs 6 --runners hvdcls keras --quiet --output-dir "$OUT/tensorflow"
