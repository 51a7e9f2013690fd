#!/bin/bash
# Issue 26/27: Horovod's background thread woken when a tensor is submitted, tried as a patch
# to Horovod 0.28.1 (0001-wake-on-enqueue.patch here; switched on by HOROVOD_WAKE_ON_ENQUEUE=1,
# off it is Horovod as released). Not part of our build: measured, no gain, left here.
# Run from the repository root on an otherwise idle machine after `make setup`.
set -eu
SRC=${SRC:-/tmp/horovod-wake}
D=benchmarks/results/2026-12-04-wake-on-enqueue
# 1. The patched tree, built in place (~4 min on 2 cores) and put first on PYTHONPATH.
rm -rf "$SRC" && mkdir -p "$SRC"
tar xzf ~/.cache/hvdcls/sdist/horovod-0.28.1.tar.gz -C "$SRC" --strip-components 1
patch -d "$SRC" -p1 < $D/0001-wake-on-enqueue.patch
.venv/bin/python - "$SRC" <<'PY'
import subprocess, sys
sys.path.insert(0, "tools")
import horovod_wheel as hw
env = hw.build_environment(hw.collect_inputs(gpu=False), hw.default_cache_dir())
subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], env=env, cwd=sys.argv[1])
PY
cp .venv/lib/python3.11/site-packages/horovod/metadata.json "$SRC/horovod/"
export PYTHONPATH=$SRC
# 2. The digits recipe at np=2, 8 interleaved rounds: the switch off, then on.
#    (Arms with one gradient group, `groups=` of hvd.DistributedOptimizer, were a local edit.)
OUT=${OUT:-runs/wake}; mkdir -p $OUT
for round in 1 2 3 4 5 6 7 8; do
  for w in 0 1; do
    HOROVOD_WAKE_ON_ENQUEUE=$w .venv/bin/hvdcls-horovodrun -np 2 -H localhost:2 --gloo \
      .venv/bin/hvdcls train --config configs/digits.yaml --epochs 5 output.checkpoint_every=0 \
      --output-dir $OUT/r$round-c$w > $OUT/r$round-c$w.log 2>&1
  done
done
# 3. ResNet-18 against raw Horovod and DDP, the switch off and on.
for w in 0 1; do
  HOROVOD_WAKE_ON_ENQUEUE=$w .venv/bin/hvdcls bench --backends torch --np 2 --compression none \
    --model resnet18 --image-size 64 --batch-size 32 --baseline-runners raw-horovod ddp --rounds 3 \
    --output-dir $OUT/resnet18-$w
done
