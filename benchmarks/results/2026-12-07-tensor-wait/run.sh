#!/bin/bash
# The tensor group's wait (torch): ViT-L/16 at 64 px, 16 images a rank, np=2 T=2 on the idle
# 2-core VM, 2026-12-07 02:57-03:08 UTC. From the repository root.
set -e
out=benchmarks/results/2026-12-07-tensor-wait
c="--backends torch --image-size 64 --batch-size 16 --compression none --no-baselines --model vit_l_16 --warmup-steps 1 --steps 2 --reps 3 --np 2 --tensor 2 --quiet"
# Horovod's synchronize() against the poll-and-nap, interleaved within one bench, two rounds
hvdcls bench $c --wait spin sleep --rounds 2 --output-dir $out/spin-sleep
# The sleeping wait's settings, one bench each, two rounds: the 0.1 ms nap (as committed), the
# same with Horovod's cycle at 1 ms, and a 1 ms nap (then a temporary override of
# torch_backend/tensor_parallel.TENSOR_NAP_SECONDS, since removed)
for r in 1 2; do
  hvdcls bench $c --wait sleep --output-dir $out/sleep-nap0.1ms-round$r
  hvdcls bench $c --wait sleep --cycle-time-ms 1 --output-dir $out/sleep-cycle1ms-round$r
  hvdcls bench $c --wait sleep --output-dir $out/sleep-nap1ms-round$r   # with the nap at 1e-3
done
