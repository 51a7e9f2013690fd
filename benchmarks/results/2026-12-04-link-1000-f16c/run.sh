#!/bin/bash
cd /work/main
source .venv/bin/activate
OUT=/work/runs/f16c
mkdir -p $OUT
for i in $(seq 60); do l=$(cut -d' ' -f1 /proc/loadavg); awk -v l=$l 'BEGIN{exit !(l<1.0)}' && break; sleep 10; done
echo "$(date -u +%H:%M:%S) start link-1000 load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log
hvdcls bench --backends torch --np 2 --compression none fp16 --model resnet50 \
    --image-size 64 --batch-size 16 --baseline-runners raw-horovod ddp --rounds 3 \
    --link-mbit 1000 --sweep-fusion-mb 32 --sweep-cycle-ms 5 --quiet --output-dir $OUT/link-1000 > $OUT/link-1000.out 2>&1
echo "$(date -u +%H:%M:%S) end link-1000 rc $?" >> $OUT/log
