#!/bin/bash
# torch training.zero with each bucket's reduction started by the gradient hooks in backward,
# against the reduction after backward (BASE: a worktree of the commit before, 6de78f6).
# From the repository root of the working tree, as root (vit_mem.py's memory cgroup):
#   git worktree add /work/scratch/base 6de78f6; BASE=/work/scratch/base bash run.sh
set -u
D=$PWD/benchmarks/results/2026-12-05-zero-overlap
BASE=${BASE:-/work/scratch/base}
OUT=${OUT:-$PWD/runs/zero-overlap}; mkdir -p "$OUT"
export PATH=$PWD/.venv/bin:$PATH VIT_LAUNCHER=hvdcls-horovodrun VIT_LIMIT_BYTES=$((19*2**30))
# 1. ResNet-50 at np=2, zero 0 and 1, one bench an arm, alternating, four pairs.
Z="$PWD/.venv/bin/hvdcls bench --backends torch --np 2 --compression none --model resnet50 --image-size 64 --batch-size 16 --zero 0 1 --no-baselines --rounds 3 --quiet"
for i in 1 2 3 4; do
  echo "# before-$i $(date -u +%T)"; (cd "$BASE" && PYTHONPATH=$BASE $Z --output-dir "$OUT/before-$i")
  echo "# after-$i $(date -u +%T)"; $Z --output-dir "$OUT/after-$i"
done
# 2. Memory: ViT-H/14, np=2, zero=2 + activation checkpointing, under a 19 GiB cap, each arm twice.
for i in 1 2; do
  echo "# vit before-$i $(date -u +%T)"
  (cd "$BASE" && PYTHONPATH=$BASE VIT_ROOT=$OUT/vit-before python $D/../2026-12-03-vit-memory/vit_mem.py h14-z2c)
  echo "# vit after-$i $(date -u +%T)"
  VIT_ROOT=$OUT/vit-after python $D/../2026-12-03-vit-memory/vit_mem.py h14-z2c
done
