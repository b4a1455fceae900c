#!/bin/bash
out=/tmp/speed
common="--partitions=2 --micro_batches=8 --remat=never,always --noinference --nocompare_single_core --schedules=gpipe,1f1b,interleaved_1f1b,zb_h1 --virtual_stages=4"
for r in 3 4; do
  for e in cf7 bf7 head; do
    echo "== $r fc $e $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/run.log
    (cd /tmp/$e && python -m tools.benchmark $common --rounds=5 --json=$out/fc-$r-$e.json > $out/fc-$r-$e.log 2>&1)
  done
done
echo "end3 $(date +%T)" >> $out/run.log
