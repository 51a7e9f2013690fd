#!/bin/sh
# horovod.wait (issue 27): the torch cells with the new default (auto: sleep over 16 MB of
# gradients) beside Horovod's spin, raw Horovod and DDP, 3 interleaved rounds each; run from
# the repository root on an otherwise idle machine. $1: a suffix for a repeat's directories.
set -e
out=benchmarks/results/2026-12-05-sleeping-wait
common="--backends torch --np 2 --compression none --rounds 3"
hvdcls bench $common --model resnet50 --image-size 64 --batch-size 16 --wait auto spin \
    --baseline-runners raw-horovod ddp --output-dir $out/resnet50$1
hvdcls bench $common --model resnet18 --image-size 64 --batch-size 32 --wait auto spin \
    --baseline-runners raw-horovod ddp --output-dir $out/resnet18$1
# the digits' model: auto spins here (0.3 MB); sleep measured beside it (the baseline scripts
# build torchvision's models only, so no baselines)
hvdcls bench $common --model compact_cnn --image-size 32 --batch-size 16 --steps 60 \
    --wait auto sleep spin --no-baselines --output-dir $out/compact_cnn$1
