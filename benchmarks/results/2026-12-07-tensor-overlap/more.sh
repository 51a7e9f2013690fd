#!/bin/bash
# Two more rounds of run.sh's T=2 cells alone (after before, then before after), to firm up
# their ratio; the T=1 cells of rounds 1-2 stay the baseline. From the repository root.
set -e
out=benchmarks/results/2026-12-07-tensor-overlap
OLD=${OLD:-/tmp/old}
tensor="--backends torch --model vit_l_16 --image-size 224 --batch-size 2"
common="--compression none --no-baselines --warmup-steps 1 --steps 2 --reps 3 --quiet"
before() { (cd "$OLD" && PYTHONPATH="$OLD" python -m hvdcls bench $tensor $common --np 2 --tensor 2 \
    --output-dir "$OLDPWD/$out/round$1/np2-before"); }
after() { python -m hvdcls bench $tensor $common --np 2 --tensor 2 --output-dir $out/round$1/np2-after; }
after 3; before 3
before 4; after 4
