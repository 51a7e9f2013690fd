#!/bin/sh
# Issue 49's speed target: images/s with training.zero=3 against zero=2 on ViT-B/16 at np=2,
# both with activation checkpointing, interleaved (each zero 3 cell right after its zero 2
# twin, two rounds), both backends, on the idle 2-core VM. 32 px images in 16 px patches,
# 8 images a rank, the bench's SGD with momentum.
set -e
hvdcls bench --backends torch tensorflow --np 2 --zero 2 3 --activation-checkpointing \
    --model vit_b_16 --image-size 32 --batch-size 8 --compression none --no-baselines \
    --warmup-steps 2 --steps 3 --reps 3 --rounds 2 --output-dir benchmarks/results/2026-12-06-zero3-speed
