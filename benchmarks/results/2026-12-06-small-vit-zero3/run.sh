#!/bin/bash
# Issue 49's accuracy check: ViT-Ti/16 (DeiT's sizes) at 16 px in patches of 4 on the digits, AdamW,
# np=2, training.zero=0 against 3 from the same seed, both backends. From the repository root.
#   bash benchmarks/results/2026-12-06-small-vit-zero3/run.sh [OUT] [LR] [extra settings...]
# The runs of README.md: LR 0.008 (default) and 0.002; extra horovod.fusion_threshold_mb=0.000001 for
# the runs without tensor fusion.
set -e
out=${1:-runs/small-vit}; lr=${2:-0.008}; shift 2 || true
export HOROVOD_GLOO_TIMEOUT_SECONDS=600
for backend in torch tensorflow; do for zero in 0 3; do
  hvdcls-horovodrun --gloo -np 2 -H localhost:2 hvdcls train --backend $backend --config configs/digits.yaml \
    --model vit_ti_16 data.image_size=16 model.patch_size=4 optimizer.name=adamw --lr $lr optimizer.weight_decay=0.05 \
    training.zero=$zero --epochs 12 output.checkpoint_every=12 --output-dir $out/$backend-zero$zero --quiet "$@"
done; done
