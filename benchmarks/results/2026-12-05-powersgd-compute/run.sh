#!/bin/sh
# PowerSGD's compute (torch), issue 27's slow-link target: from the repository root, as root (the
# shaped link), on an otherwise idle machine. "before" ran with torch_backend/compression.py as at
# bbbf480 (unchanged up to fc7f7ba), "after" at 09eb0b5 and
# later; each bench has DDP's PowerSGD hook (one bucket) beside hvdcls as the control.
set -e
out=benchmarks/results/2026-12-05-powersgd-compute
common="--backends torch --np 2 --model resnet50 --image-size 64 --batch-size 16 --baseline-runners ddp --rounds 3 --warmup 2 --steps 3 --reps 2"
# across 100 Mbit/s (before: with --wait auto spin and the default sweep grid)
hvdcls bench $common --compression powersgd --link-mbit 100 --sweep-fusion-mb 32 --sweep-cycle-ms 5 \
    --output-dir $out/link-100-after
# the same with P and Q all-reduced in float16 (horovod.powersgd.fp16)
hvdcls bench $common --compression powersgd --powersgd-fp16 --link-mbit 100 --sweep-fusion-mb 32 \
    --sweep-cycle-ms 5 --output-dir $out/link-100-fp16-factors
# no link (loopback); before: --rounds 2
hvdcls bench $common --compression none powersgd --output-dir $out/loopback-after
# the compression alone, one thread, before against after (see its docstring)
git show deba838:torch_backend/compression.py > /tmp/compression_old.py
OMP_NUM_THREADS=1 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 \
    python $out/compute.py /tmp/compression_old.py > $out/compute.txt
python $out/skinny.py > $out/skinny.txt
