#!/bin/sh
# Issue 26: the global batch from 64 to 512 at np=2 (the digits' recipe: SGD 0.4 per 256,
# cosine over 20 epochs), the linear (per256) and square-root rules, 1 and 3 warmup epochs,
# 3 runs a cell; from the repository root on an otherwise idle machine (~8 minutes).
hvdcls bench --to-accuracy 0.9 --backends torch --np 2 --batch-size 32 64 128 256 \
    --scale-lr per256 sqrt --warmup-epochs 1 3 --max-epochs 20 --runs 3 \
    --output-dir benchmarks/results/2026-12-05-batch-scaling-rules
