#!/bin/sh
# Issue 27, 2026-12-05 evening (after horovod.wait): Horovod's cycle time with the sleeping wait,
# and DDP measured against itself (the per-round noise floor). From the repository root on an
# otherwise idle machine; cmp2.py interleaves the arms round by round (bench cells,
# hvdcls.bench.matrix.run_cell: np=2, 64 px, 3 x 10 timed steps a cell) and prints each arm's
# img/s per round and its ratio to the `ddp` arm.
set -e
cmp2=benchmarks/results/2026-12-05-sleeping-wait/explore/cmp2.py
out=benchmarks/results/2026-12-05-ddp-noise-floor
python $cmp2 resnet50 16 3 c5=gloo c10=gloo,HOROVOD_CYCLE_TIME=10 c20=gloo,HOROVOD_CYCLE_TIME=20 \
    c2=gloo,HOROVOD_CYCLE_TIME=2 ddp=ddp > $out/resnet50-cycle.log
python $cmp2 resnet50 16 4 c5=gloo c20=gloo,HOROVOD_CYCLE_TIME=20 c50=gloo,HOROVOD_CYCLE_TIME=50 \
    ddp=ddp > $out/resnet50-cycle-2.log
python $cmp2 resnet18 32 4 c5=gloo c20=gloo,HOROVOD_CYCLE_TIME=20 c50=gloo,HOROVOD_CYCLE_TIME=50 \
    ddp=ddp > $out/resnet18-cycle.log
# two identical DDP arms beside hvdcls at its defaults (horovod.wait=auto: asleep here)
python $cmp2 resnet50 16 5 hvdcls=gloo ddp_again=ddp ddp=ddp > $out/resnet50-ddp-against-ddp.log
