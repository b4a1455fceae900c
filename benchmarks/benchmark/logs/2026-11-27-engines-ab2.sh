#!/bin/bash
out=/tmp/speed
common="--partitions=2 --micro_batches=8 --noinference --nocompare_single_core --block=transformer --num_blocks=8 --batch_size=64 --rounds=3 --steps_per_round=2 --schedules=gpipe,1f1b --remat=never"
for r in 1 2 3 4; do
  for e in head var bf7; do
    echo "== ab2 $r $e $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/ab2.log
    (cd /tmp/$e && python -m tools.benchmark $common --json=$out/ab2-$r-$e.json > $out/ab2-$r-$e.log 2>&1)
  done
done
echo "end $(date +%T)" >> $out/ab2.log
