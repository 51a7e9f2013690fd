#!/bin/bash
# Issues 49 and 50's speed targets again, at the models' own resolution (224 px, 196 patches
# and the class token) instead of the CPU sizes of 2026-12-06 (32 and 64 px), on the idle
# 2-core VM, both backends, two interleaved rounds. From the repository root.
#   zero:   ViT-B/16, np=2, zero 2 then zero 3, both with activation checkpointing, 4 images a rank
#   tensor: ViT-L/16, np=1 T=1 under `taskset -c 0` (one core, one thread) then np=2 T=2, 2 images a rank
set -e
out=benchmarks/results/2026-12-07-native-size
zero="--np 2 --zero 2 3 --activation-checkpointing --model vit_b_16 --image-size 224 --batch-size 4"
tensor="--model vit_l_16 --image-size 224 --batch-size 2"
common="--compression none --no-baselines --warmup-steps 1 --steps 2 --reps 3 --quiet"
for round in 1 2; do
  for backend in torch tensorflow; do
    hvdcls bench --backends $backend $zero $common --output-dir $out/zero-$backend-round$round
    taskset -c 0 hvdcls bench --backends $backend $tensor $common --np 1 --tensor 1 \
        --output-dir $out/tensor-$backend-round$round/np1
    hvdcls bench --backends $backend $tensor $common --np 2 --tensor 2 \
        --output-dir $out/tensor-$backend-round$round/np2
  done
done
