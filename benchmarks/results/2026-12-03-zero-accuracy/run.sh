#!/bin/bash
# issue 28: digits trained with zero 0, 1, 2 at np=2, same seed, both backends
cd /work/main; source .venv/bin/activate
for backend in torch tensorflow; do
  for z in 0 1 2; do
    out=/work/runs28/acc/$backend-zero$z
    rm -rf $out
    /usr/bin/time -f "%e s" horovodrun --gloo -np 2 -H localhost:2 hvdcls train --backend $backend \
      --config configs/digits.yaml --seed 0 --quiet training.zero=$z --output-dir $out \
      > /work/runs28/acc-$backend-$z.log 2>&1
    echo "$backend zero=$z rc=$? $(tail -1 /work/runs28/acc-$backend-$z.log)"
  done
done
