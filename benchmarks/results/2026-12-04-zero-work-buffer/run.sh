#!/bin/sh
# torch zero=1 against zero=0 at np=2 (ResNet-50, 64 px, batch 16, SGD with momentum), first
# with the sharded step as it was (each bucket's flat gradients and the all-reduce's result made
# afresh every step), then with the reused `work` buffer reduced in place. Run from the
# repository root on an otherwise idle machine, the old code checked out for the first run
# (OLD=1: the caller has put it in place), ~5 min each.
set -eu
OUT=${OUT:-benchmarks/results/2026-12-04-zero-work-buffer}
ARM=${ARM:?ARM=before or ARM=after}
uptime
.venv/bin/hvdcls bench --backends torch --np 2 --compression none --model resnet50 --image-size 64 \
    --batch-size 16 --zero 0 1 --no-baselines --rounds 3 --quiet --output-dir "$OUT/$ARM"
uptime
