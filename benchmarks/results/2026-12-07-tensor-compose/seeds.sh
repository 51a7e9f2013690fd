#!/bin/bash
# The noise floor of run.py's comparison: the same np=2 data-parallel torch run with seeds 1 and
# 2 (run.py's ran with seed 0), on one host (the data-parallel run gave the same accuracy to the
# last digit under mpirun and horovodrun across the containers, so the host does not enter).
# From the repository root; the accuracies go to seeds.json here.
set -e
here=benchmarks/results/2026-12-07-tensor-compose
for seed in 1 2; do
  hvdcls-horovodrun --gloo -np 2 -H localhost:2 hvdcls train --backend torch --config configs/digits.yaml \
    --model vit_s_16 data.image_size=16 model.patch_size=4 optimizer.name=adamw --lr 0.002 \
    optimizer.weight_decay=0.05 --epochs 10 output.checkpoint_every=10 training.seed=$seed \
    --output-dir /tmp/tp-seeds/dp-seed$seed --quiet
done
python - "$here/seeds.json" <<'PY'
import json, sys
runs = {}
for seed in (1, 2):
    metrics = [json.loads(line) for line in open(f"/tmp/tp-seeds/dp-seed{seed}/metrics.jsonl")]
    runs[f"torch-dp-np2-seed{seed}"] = {"val_accuracy": metrics[-1]["val_accuracy"],
                                       "val_accuracy_by_epoch": [m["val_accuracy"] for m in metrics]}
open(sys.argv[1], "w").write(json.dumps(runs, indent=1) + "\n")
PY
