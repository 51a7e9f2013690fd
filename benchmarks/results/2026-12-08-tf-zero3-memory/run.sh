#!/bin/bash
# TensorFlow's zero=3 memory (2026-12-08), from the repository root, as root (the memory cgroup).
# Before: a worktree at 61aadb8 (git worktree add /tmp/wt 61aadb8); after: this tree.
set -e
here=benchmarks/results/2026-12-08-tf-zero3-memory
export PATH=$PWD/.venv/bin:$PATH
# 1. ViT-B/16 at 32 px, zero=3 + activation checkpointing, np=2: before and after, interleaved,
#    and zero=2 beside (ab.txt; "/tmp/wt" is before, "/work/main" after).
for round in 1 2 3 4; do
  for tree in /tmp/wt "$PWD"; do
    echo "round $round $tree"
    (cd "$tree" && PYTHONPATH=$tree hvdcls-horovodrun --gloo -np 2 -H localhost:2 \
       python "$OLDPWD/$here/step_probe.py" 3 vit_b_16 32 2>&1 | grep RESULT | grep "\[0\]")
  done
  hvdcls-horovodrun --gloo -np 2 -H localhost:2 python $here/step_probe.py 2 vit_b_16 32 2>&1 | grep RESULT | grep "\[0\]"
done
# 2. ViT-H/14 (then ViT-g/14) at np=2: three AdamW steps, the sharded checkpoint, a resume for a
#    fourth, under a cgroup of the machine's memory less 1.5 GB (../2026-12-06-vit-g-zero3/vit_g.py).
for allocator in "" system; do
  HVDCLS_ALLOCATOR=$allocator VIT_MODEL=vit_h_14 HOROVOD_GLOO_TIMEOUT_SECONDS=600 VIT_ROOT=/work/runs/vith-$allocator \
    python benchmarks/results/2026-12-06-vit-g-zero3/vit_g.py tensorflow
done
HOROVOD_GLOO_TIMEOUT_SECONDS=600 VIT_ROOT=/work/runs/vitg python benchmarks/results/2026-12-06-vit-g-zero3/vit_g.py tensorflow
# memprobe.txt: the resident set at the build's stages, printed by instrumented.diff's lines (MEMPROBE=1).
