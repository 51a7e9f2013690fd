#!/bin/bash
# Issue 27 phase B arms, ResNet-18, one after the other on an otherwise idle machine.
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
OUT=${OUT:-runs/phase-b}
B18="hvdcls bench --backends torch --np 2 --compression none --model resnet18 --image-size 64 --batch-size 32 --baseline-runners raw-horovod ddp --rounds 3"
arm() {
  name=$1; shift
  for i in $(seq 60); do
    l=$(cut -d' ' -f1 /proc/loadavg); awk -v l=$l 'BEGIN{exit !(l<1.0)}' && break; sleep 10
  done
  echo "$(date -u +%H:%M:%S) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log
  env "$@" $B18 $EXTRA --output-dir $OUT/$name > $OUT/$name.out 2>&1
  echo "$(date -u +%H:%M:%S) end $name rc $?" >> $OUT/log
}
EXTRA= arm b18-default X=1
EXTRA="--cycle-time-ms 10" arm b18-c10 X=1
EXTRA="--cycle-time-ms 20" arm b18-c20 X=1
EXTRA="--fusion-threshold-mb 64" arm b18-f64 X=1
EXTRA= arm b18-aff01 HOROVOD_THREAD_AFFINITY=0,1
EXTRA= arm b18-aff10 HOROVOD_THREAD_AFFINITY=1,0
EXTRA= arm b18-nocache HOROVOD_CACHE_CAPACITY=0
echo done >> $OUT/log
