#!/bin/bash
# Issue 50: the backward sums of the tensor group started before the column-split layers'
# weight gradients (this directory's commit) against the commit before (a worktree of it at
# $OLD), ViT-L/16 at 224 px, 2 images a rank, torch, on the idle 2-core VM, two interleaved
# rounds: np=1 T=1 under `taskset -c 0`, then np=2 T=2 before, then after. From the repository root.
set -e
out=benchmarks/results/2026-12-07-tensor-overlap
OLD=${OLD:-/tmp/old}
tensor="--backends torch --model vit_l_16 --image-size 224 --batch-size 2"
common="--compression none --no-baselines --warmup-steps 1 --steps 2 --reps 3 --quiet"
for round in 1 2; do
  taskset -c 0 python -m hvdcls bench $tensor $common --np 1 --tensor 1 --output-dir $out/round$round/np1
  (cd "$OLD" && PYTHONPATH="$OLD" python -m hvdcls bench $tensor $common --np 2 --tensor 2 \
      --output-dir "$OLDPWD/$out/round$round/np2-before")
  python -m hvdcls bench $tensor $common --np 2 --tensor 2 --output-dir $out/round$round/np2-after
done
