#!/bin/bash
# Issue 26 constraint: speed at least bf702b5's, aiming at the 0.2 engine's (cf793f4); shared mode,
# three engines in git worktrees, alternating, two rounds; FC then Transformer.
out=/tmp/speed
common="--partitions=2 --micro_batches=8 --remat=never,always --noinference --nocompare_single_core --schedules=gpipe,1f1b,interleaved_1f1b,zb_h1 --virtual_stages=4"
for r in 1 2; do
  for e in head bf7 cf7; do
    echo "== $r fc $e $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/run.log
    (cd /tmp/$e && python -m tools.benchmark $common --rounds=5 --json=$out/fc-$r-$e.json > $out/fc-$r-$e.log 2>&1)
  done
  for e in head bf7 cf7; do
    echo "== $r transformer $e $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/run.log
    (cd /tmp/$e && python -m tools.benchmark $common --block=transformer --num_blocks=8 --batch_size=64 --rounds=3 --steps_per_round=2 --json=$out/tr-$r-$e.json > $out/tr-$r-$e.log 2>&1)
  done
done
echo "end $(date +%T)" >> $out/run.log
