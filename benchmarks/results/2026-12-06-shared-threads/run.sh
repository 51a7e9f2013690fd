#!/bin/sh
# The digits at np=2, torch, the two ranks under two host names of one 2-core machine: with the
# threads hvdcls now gives each rank (its share of the cores) and with training.threads=2 (each
# rank takes both cores, as before the shared-threads change), alternated twice. From the
# repository root; output.txt is what it printed (each run's epoch lines).
out=${OUT:-/tmp/shared-threads}
mkdir -p $out
for round in 1 2; do
  for arm in shared both; do
    case $arm in shared) extra="";; both) extra="training.threads=2";; esac
    echo "# round $round, $arm ($extra) $(date -u +%H:%M:%S), $(cut -d' ' -f1-3 /proc/loadavg)"
    .venv/bin/hvdcls-horovodrun -np 2 -H localhost:1,127.0.0.1:1 --gloo .venv/bin/python -m hvdcls train \
      --backend torch --config configs/digits.yaml --epochs 3 --output-dir $out/$arm-$round \
      output.checkpoint_every=0 $extra 2>&1 | grep -E "epoch [0-9]+:|done:"
  done
done
