#!/bin/sh
# validation accuracy of PowerSGD rank 4 with float16 P and Q against float32 P and Q and no
# compression: torch, np=2, the digits (12 epochs of compact_cnn, 6 of ResNet-18 at 32 px); from
# the repository root, output.txt is what it printed
out=${OUT:-/tmp/powersgd-accuracy}
mkdir -p $out
for model in compact_cnn resnet18; do
  if [ $model = compact_cnn ]; then extra="--epochs 12"; seeds="0 1"; else extra="--epochs 6 data.image_size=32"; seeds="0"; fi
  for seed in $seeds; do
    for arm in none powersgd powersgd-fp16; do
      case $arm in
        none) c="horovod.compression=none";;
        powersgd) c="horovod.compression=powersgd horovod.powersgd.rank=4";;
        powersgd-fp16) c="horovod.compression=powersgd horovod.powersgd.rank=4 horovod.powersgd.fp16=true";;
      esac
      dir=$out/$model-$arm-seed$seed
      .venv/bin/hvdcls-horovodrun -np 2 -H localhost:2 .venv/bin/python -m hvdcls train --backend torch \
        --config configs/digits.yaml $extra --output-dir $dir --quiet model.name=$model training.seed=$seed $c \
        output.checkpoint_every=0 > $dir.log 2>&1
      python3 -c "import json,sys; s=json.load(open('$dir/summary.json')); print('$model $arm seed $seed', 'final', s.get('final_val_accuracy', s.get('val_accuracy')), 'best', s.get('best_val_accuracy'), 'bytes', s['communication']['bytes_per_step'])"
    done
  done
done
