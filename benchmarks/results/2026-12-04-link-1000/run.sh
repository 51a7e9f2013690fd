#!/bin/bash
# After run.sh's b50-default: link-1000, to-accuracy (issue 26's seconds), zero A/B (issue 28), link-100.
cd /work/main
source .venv/bin/activate
OUT=/work/runs/q1204
wait_quiet() {
  for i in $(seq 60); do
    l=$(cut -d' ' -f1 /proc/loadavg); awk -v l=$l 'BEGIN{exit !(l<1.0)}' && break; sleep 10
  done
}
arm() {
  name=$1; shift
  wait_quiet
  echo "$(date -u +%H:%M:%S) start $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log
  "$@" --output-dir $OUT/$name > $OUT/$name.out 2>&1
  echo "$(date -u +%H:%M:%S) end $name rc $?" >> $OUT/log
}
link() {
  arm link-$1 hvdcls bench --backends torch --np 1 2 --compression none fp16 powersgd --model resnet50 \
    --image-size 64 --batch-size 16 --baseline-runners raw-horovod ddp --rounds 3 \
    --link-mbit $1 --sweep-fusion-mb 32 --sweep-cycle-ms 5 --quiet
}
ZB="hvdcls bench --np 2 --compression none --model resnet50 --image-size 64 --batch-size 16 --zero 0 1 --no-baselines --rounds 3 --backends torch --quiet"
link 1000
arm zero-base env PYTHONPATH=$OUT/base $ZB
arm zero-new env PYTHONPATH=$OUT/new $ZB
arm to-accuracy hvdcls bench --to-accuracy 0.9 --np 1 2 --runs 5 --max-epochs 6 --runners hvdcls ddp keras --quiet
echo done2 >> $OUT/log
