#!/bin/sh
# parallel.tensor on the bench (issue 50 item 4): ViT-B/16 and ViT-L/16 at a CPU size (32 px
# with 16 px patches: 4 patches and the class token; 8 images a rank), T=1 beside T=2, run
# from the repository root. ViT-L/16's np=1 cell timed out (900 s) on the loaded machine, so
# its bench ran at np=2 alone with fewer steps.
set -e
out=benchmarks/results/2026-12-06-tensor-bench
common="--backends torch --tensor 1 2 --image-size 32 --batch-size 8 --compression none --no-baselines"
hvdcls bench $common --np 1 2 --model vit_b_16 --warmup-steps 2 --steps 3 --reps 3 --output-dir $out/vit_b_16
hvdcls bench $common --np 2 --model vit_l_16 --warmup-steps 0 --steps 1 --reps 3 --output-dir $out/vit_l_16
