#!/bin/sh
# Times gpipe_tf (--devices=processes) and PyTorch's pipelining on the same
# models and schedules, one after the other, from the repository root:
#   TORCH_PYTHON=/path/to/python/with/torch sh benchmarks/peers/run.sh
# Writes benchmarks/peers/logs/<date>-<model>-{gpipe_tf,torch}.{log,json}.
set -e
TORCH_PYTHON=${TORCH_PYTHON:-python}
M=${M:-8}
STEPS=${STEPS:-7}  # 3 let one slow round of a shared machine decide a median
SCHEDULES=gpipe,1f1b,interleaved_1f1b,zbv,dualpipe_v
DAY=$(date -u +%Y-%m-%d)
LOGS=benchmarks/peers/logs
mkdir -p "$LOGS"
for MODEL in transformer fc; do
  if [ "$MODEL" = transformer ]; then
    SHAPE="--block=transformer --num_blocks=8 --batch_size=64"
  else
    SHAPE="--block=fc --num_blocks=32 --batch_size=2048"
  fi
  OUT="$LOGS/$DAY-$MODEL"
  date -u +"gpipe_tf start %H:%M:%S" > "$OUT-gpipe_tf.log"
  python -m tools.benchmark --devices=processes $SHAPE --partitions=2 \
      --micro_batches="$M" --remat=never --noinference \
      --schedules=$SCHEDULES,zb_h1 --nocompare_single_core \
      --rounds="$STEPS" --steps_per_round=1 --json="$OUT-gpipe_tf.json" \
      2>/dev/null >> "$OUT-gpipe_tf.log"
  date -u +"gpipe_tf end %H:%M:%S" >> "$OUT-gpipe_tf.log"
  date -u +"torch start %H:%M:%S" > "$OUT-torch.log"
  "$TORCH_PYTHON" benchmarks/peers/torch_pipelining.py --model="$MODEL" \
      --micro_batches="$M" --schedules=$SCHEDULES,interleaved_zb \
      --steps="$STEPS" --warmup=1 --json="$OUT-torch.json" \
      2>/dev/null >> "$OUT-torch.log"
  date -u +"torch end %H:%M:%S" >> "$OUT-torch.log"
done
