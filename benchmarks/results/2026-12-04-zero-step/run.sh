#!/bin/bash
# Issue 28's step-time target: zero 0/1/2 at np=2, ResNet-50, 64 px, batch 16 per rank,
# 3 interleaved rounds, one bench run per variant of the sharded step, one after the other on an
# otherwise idle machine. A variant is a copy of the tree put first on PYTHONPATH:
#   before               the committed step (torch: reduce bucket by bucket after backward)
#   torch-overlap-64mb   torch-overlap.diff applied (each bucket's reduction started from backward)
#   torch-overlap-16mb   the same with hvdcls.zero.BUCKET_ELEMENTS = 1 << 22
# and the ViT-H/14 check: benchmarks/results/2026-12-03-vit-memory/vit_mem.py h14-z2c with
# VIT_LIMIT_BYTES=$((19 * 1024 ** 3)), for each variant.
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
B="hvdcls bench --np 2 --compression none --model resnet50 --image-size 64 --batch-size 16 --zero 0 1 2 --no-baselines --rounds 3"
PYTHONPATH=${TREE:-.} $B --backends ${BACKENDS:-torch tensorflow} --output-dir ${OUT:-runs/zero-step}
