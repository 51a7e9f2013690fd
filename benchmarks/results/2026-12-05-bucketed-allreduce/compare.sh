#!/bin/bash
# interleaved: DistributedOptimizer, bucketed, DDP; ResNet-50 64 px batch 16, np=2, 3 rounds
export PATH=$(cd "$(dirname "$0")/../../.." && pwd)/.venv/bin:$PATH OMP_NUM_THREADS=1
export HOROVOD_FUSION_THRESHOLD=33554432 HOROVOD_CYCLE_TIME=5
MODEL=${MODEL:-resnet50}; BS=${BS:-16}
ARGS="--model $MODEL --image-size 64 --batch-size $BS --warmup 3 --steps 10 --reps 3"
OUT=${OUT:-$PWD/cmp}; mkdir -p $OUT; export OUT
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../../.." && pwd)
export PYTHONPATH=$REPO/benchmarks
for round in ${ROUNDS:-1 2 3}; do
  for v in ${VARIANTS:-dist bucket ddp}; do
    if [ $v = ddp ]; then
      timeout 600 torchrun --standalone --nproc_per_node 2 $REPO/benchmarks/ddp_torch.py $ARGS --out $OUT/$v.$round.json > $OUT/$v.$round.log 2>&1
    else
      timeout 600 horovodrun -np 2 -H localhost:2 --gloo python $HERE/bucket_hvd.py --variant $v $ARGS --out $OUT/$v.$round.json > $OUT/$v.$round.log 2>&1
    fi
    echo "$round $v rc=$?"
  done
done
python - <<'PY'
import json, glob, statistics, os
out = os.environ["OUT"]
res = {}
for v in ("dist", "bucket", "bsleep", "nocomm", "ddp"):
    for r in (1, 2, 3):
        try:
            d = json.load(open(f"{out}/{v}.{r}.json"))
        except Exception:
            continue
        res.setdefault(v, []).append(statistics.median(d["images_per_sec"]))
for v, xs in res.items():
    print(v, [round(x, 1) for x in xs], "median", round(statistics.median(xs), 1))
for r in range(3):
    try:
        if "bsleep" in res: print("round", r + 1, "bsleep/dist %.3f" % (res["bsleep"][r] / res["dist"][r]), "bsleep/ddp %.3f" % (res["bsleep"][r] / res["ddp"][r]))
        print("round", r + 1, "bucket/dist %.3f" % (res["bucket"][r] / res["dist"][r]),
              "bucket/ddp %.3f" % (res["bucket"][r] / res["ddp"][r]), "dist/ddp %.3f" % (res["dist"][r] / res["ddp"][r]))
    except Exception:
        pass
PY
