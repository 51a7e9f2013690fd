#!/bin/bash
# TensorFlow ViT-H/14 at np=2, zero=2 + activation checkpointing, under the 22 GB memory cgroup
# (vit_mem.py, root), with the lazy weight digest and the synced checkpoint writer: as shipped
# (tcmalloc), on glibc, and on tcmalloc returning freed spans at once. From the repository root.
set -u
D=benchmarks/results/2026-12-05-vit-tf-h14
export PATH=$PWD/.venv/bin:$PATH VIT_LAUNCHER=hvdcls-horovodrun
run() {  # NAME ENV...
  local name=$1; shift
  rm -rf "runs/vit-$name"
  echo "# $name: $* $(date -u +%T)" >> $D/output.txt
  env "$@" VIT_ROOT=runs/vit-$name python benchmarks/results/2026-12-03-vit-memory/vit_mem.py tf-h14-z2c >> $D/output.txt
  cp "runs/vit-$name/tf-h14-z2c.json" "$D/$name.json"
}
run shipped HVDCLS_ALLOCATOR=tcmalloc
run system HVDCLS_ALLOCATOR=system
run decommit HVDCLS_ALLOCATOR=tcmalloc TCMALLOC_AGGRESSIVE_DECOMMIT=true
