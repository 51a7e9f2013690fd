#!/bin/bash
# Issue 26: the digits recipe at np=2, Horovod cycle time 5 / 2 / 1 ms, 8 interleaved rounds.
cd /work/main && source .venv/bin/activate
OUT=/work/runs/cycle-ab; mkdir -p $OUT
for round in 1 2 3 4 5 6 7 8; do
  for ms in 5 2 1; do
    hvdcls-horovodrun -np 2 -H localhost:2 --gloo hvdcls train --config configs/digits.yaml --epochs 5 \
      horovod.cycle_time_ms=$ms output.checkpoint_every=0 --output-dir $OUT/r$round-c$ms > $OUT/r$round-c$ms.log 2>&1
    echo "$round $ms rc $? $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/log
  done
done
