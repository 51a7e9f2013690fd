#!/bin/sh
# parallel.tensor on the bench, both backends side by side (issue 50 item 4): ViT-B/16 and
# ViT-L/16 at a CPU size (32 px with 16 px patches: 4 patches and the class token; 8 images a
# rank), T=1 beside T=2 at np=2, run from the repository root on the idle VM.
set -e
out=benchmarks/results/2026-12-07-tensor-bench-tf
common="--backends torch tensorflow --np 2 --tensor 1 2 --image-size 32 --batch-size 8 --compression none --no-baselines"
hvdcls bench $common --model vit_b_16 --warmup-steps 2 --steps 3 --reps 3 --output-dir $out/vit_b_16
hvdcls bench $common --model vit_l_16 --warmup-steps 1 --steps 2 --reps 3 --output-dir $out/vit_l_16
# TensorFlow's sums timed inside the step (forward_share.py, not shipped), interleaved: untimed,
# the forward's timed, all timed
for round in 1 2 3; do
  for mode in none forward all; do
    horovodrun -np 2 -H localhost:2 python $out/forward_share.py $mode 2>&1 | grep -o "$mode: [^[]*"
  done
done | tee $out/forward_share.txt
# The GELU's own gradient against the composed form, one process, interleaved (gelu_speed.py)
for round in 1 2 3 4; do
  for mode in shipped composed; do
    python $out/gelu_speed.py $mode 2>&1 | grep -o "$mode: .*"
  done
done | tee $out/gelu_speed.txt
