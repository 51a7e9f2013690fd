#!/bin/sh
# Issue 50's efficiency target, torch: ViT-L/16's images/s at T=2 (np=2, one core and one
# thread a rank) over twice those of one rank with one core and one thread at T=1 (np=1 under
# `taskset -c 0`, so the bench's threads_per_rank, the usable cores over np, is 1). Same batch
# (8 images a rank, 32 px, 16 px patches). Two rounds, interleaved: np=1, then np=2, twice.
set -e
out=benchmarks/results/2026-12-06-tensor-efficiency
common="--backends torch --image-size 32 --batch-size 8 --compression none --no-baselines --model vit_l_16 --warmup-steps 1 --steps 2 --reps 3 --quiet"
for round in 1 2; do
  taskset -c 0 hvdcls bench $common --np 1 --tensor 1 --output-dir $out/round$round/np1
  hvdcls bench $common --np 2 --tensor 2 --output-dir $out/round$round/np2
done

# The same at a size where the blocks' arithmetic outweighs the per-step costs that do not
# shrink with the batch (the optimizer's pass over the weights, the all-reduces' latency):
# 64 px images (16 patches and the class token), 16 images a rank.
common64="--backends torch --image-size 64 --batch-size 16 --compression none --no-baselines --model vit_l_16 --warmup-steps 1 --steps 2 --reps 3 --quiet"
for round in 1 2; do
  taskset -c 0 hvdcls bench $common64 --np 1 --tensor 1 --output-dir $out/px64-round$round/np1
  hvdcls bench $common64 --np 2 --tensor 2 --output-dir $out/px64-round$round/np2
done

# The machine's own ceiling for two busy cores: two np=1 T=1 benches at once, one on each core
# (no communication at all); what each gets against one alone (px64-round*/np1) is what two
# ranks sharing this VM's memory and caches can reach.
common64="--backends torch --image-size 64 --batch-size 16 --compression none --no-baselines --model vit_l_16 --warmup-steps 1 --steps 2 --reps 3 --quiet"
taskset -c 0 hvdcls bench $common64 --np 1 --tensor 1 --output-dir $out/px64-pair/core0 &
taskset -c 1 hvdcls bench $common64 --np 1 --tensor 1 --output-dir $out/px64-pair/core1
wait

# Horovod's cycle time (the background loop's period, 5 ms by default in hvdcls) under the
# tensor group's blocking all-reduces: 1 ms and 0.2 ms.
for c in 1 0.2; do
  hvdcls bench $common64 --np 2 --tensor 2 --cycle-time-ms $c --output-dir $out/px64-cycle$c/np2
done

# TensorFlow, 64 px, 16 images a rank, two rounds (its bench cells time the step; the group's
# sums run inside the compiled step, so their share is not timed apart).
commontf="--backends tensorflow --image-size 64 --batch-size 16 --compression none --no-baselines --model vit_l_16 --warmup-steps 1 --steps 2 --reps 3 --quiet"
for round in 1 2; do
  taskset -c 0 hvdcls bench $commontf --np 1 --tensor 1 --output-dir $out/tf-px64-round$round/np1
  hvdcls bench $commontf --np 2 --tensor 2 --output-dir $out/tf-px64-round$round/np2
done
