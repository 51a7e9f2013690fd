#!/bin/bash
# tcmalloc for the training processes (hvdcls/allocator.py). Run from the repository root on an
# otherwise idle machine after `make setup` (which installs libtcmalloc-minimal4).
# Parts 1-3 preload by hand (every process, peers included); part 4 is hvdcls as shipped
# (its ranks re-execute themselves with tcmalloc; raw Horovod and DDP as their users run them).
set -u
OUT=${OUT:-runs/tcmalloc}; mkdir -p "$OUT"
D=benchmarks/results/2026-12-05-tcmalloc
TC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
JE=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2     # apt-get install libjemalloc2
GLIBC=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184
export HVDCLS_ALLOCATOR=system  # parts 1-3: the allocator is the arm's, not hvdcls's
# 1. One process, ResNet-50 step (64 px, batch 16, one thread), two rounds of four arms.
for i in 1 2; do
  .venv/bin/python $D/step.py default
  GLIBC_TUNABLES=$GLIBC .venv/bin/python $D/step.py glibc32
  LD_PRELOAD=$JE .venv/bin/python $D/step.py jemalloc
  LD_PRELOAD=$TC .venv/bin/python $D/step.py tcmalloc
done
# 2. ResNet-50 at np=2, zero 0 and 1: glibc, tcmalloc, glibc tuned (one bench each).
Z=".venv/bin/hvdcls bench --backends torch --np 2 --compression none --model resnet50 --image-size 64 --batch-size 16 --zero 0 1 --no-baselines --rounds 3 --quiet"
$Z --output-dir "$OUT/zero-default"
LD_PRELOAD=$TC $Z --output-dir "$OUT/zero-tcmalloc"
GLIBC_TUNABLES=$GLIBC $Z --output-dir "$OUT/zero-glibc"
# 3. The digits recipe at np=2, 5 interleaved rounds, glibc then tcmalloc.
for round in 1 2 3 4 5; do
  for arm in off tc; do
    P=; [ $arm = tc ] && P=$TC
    LD_PRELOAD=$P .venv/bin/hvdcls-horovodrun -np 2 -H localhost:2 --gloo .venv/bin/hvdcls train \
      --config configs/digits.yaml --epochs 5 output.checkpoint_every=0 --output-dir "$OUT/r$round-c$arm" \
      > "$OUT/r$round-c$arm.log" 2>&1
  done
done
unset HVDCLS_ALLOCATOR
# 4. As shipped: ResNet-18 against raw Horovod and DDP (hvdcls on tcmalloc; then everyone on
#    glibc; then everyone on tcmalloc), and the digits to 0.9 against DDP.
B18=".venv/bin/hvdcls bench --backends torch --np 2 --compression none --model resnet18 --image-size 64 --batch-size 32 --baseline-runners raw-horovod ddp --rounds 3 --quiet"
$B18 --output-dir "$OUT/b18-tcmalloc"
HVDCLS_ALLOCATOR=system $B18 --output-dir "$OUT/b18-system"
LD_PRELOAD=$TC $B18 --output-dir "$OUT/b18-all-tcmalloc"
.venv/bin/hvdcls bench --to-accuracy 0.9 --backends torch --np 1 2 --batch-size 16 --runs 5 \
    --max-epochs 6 --runners hvdcls ddp --quiet --output-dir "$OUT/acc"
# 5. Memory at the edge: ViT-H/14, np=2, zero=2 + checkpointing under a 19 GiB cap (needs root
#    for the memory cgroup), as shipped and on glibc.
for a in tcmalloc system; do
  HVDCLS_ALLOCATOR=$a VIT_ROOT=runs/vit-$a VIT_LAUNCHER=hvdcls-horovodrun VIT_LIMIT_BYTES=$((19*2**30)) \
    PATH=$PWD/.venv/bin:$PATH python benchmarks/results/2026-12-03-vit-memory/vit_mem.py h14-z2c
done
# 6. As shipped, ResNet-50 against raw Horovod and DDP, and zero 0 against zero 1.
R50=".venv/bin/hvdcls bench --backends torch --np 2 --compression none --model resnet50 --image-size 64 --batch-size 16 --rounds 3 --quiet"
$R50 --baseline-runners raw-horovod ddp --output-dir "$OUT/shipped-b50"
$R50 --zero 0 1 --no-baselines --output-dir "$OUT/shipped-zero"
