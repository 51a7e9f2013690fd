#!/bin/sh
# Issue 26's first two targets at global batches of 32 to 128 (the digits' recipe), 7 runs a
# cell, hvdcls and the torchrun + DDP reference; from the repository root on an idle machine.
hvdcls bench --to-accuracy 0.9 --backends torch --np 1 2 --batch-size 32 64 --runs 7 \
    --max-epochs 6 --runners hvdcls ddp --output-dir benchmarks/results/2026-12-05-to-accuracy-global64
