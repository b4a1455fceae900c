#!/bin/bash
# A/B: head vs variant (/tmp/var) on the Transformer, gpipe and zb_h1, alternating
out=/tmp/speed
common="--partitions=2 --micro_batches=8 --noinference --nocompare_single_core --block=transformer --num_blocks=8 --batch_size=64 --rounds=3 --steps_per_round=2"
for r in 1 2; do
  for e in head var var2 bf7; do
    echo "== ab $r $e $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/ab.log
    (cd /tmp/$e && python -m tools.benchmark $common --schedules=gpipe,zb_h1 --remat=never,always --json=$out/ab-$r-$e.json > $out/ab-$r-$e.log 2>&1)
  done
done
echo "end $(date +%T)" >> $out/ab.log
