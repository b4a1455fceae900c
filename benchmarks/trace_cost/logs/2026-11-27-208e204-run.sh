#!/bin/bash
# item 3 re-measure: this engine (208e204) beside bf702b5, alternating, two rounds
out=/tmp/tc
for r in 1 2; do
 for s in gpipe 1f1b zb_h1 interleaved_1f1b; do
  extra=""; [ $s = interleaved_1f1b ] && extra="--virtual_stages=2"
  for e in head bf7; do
   echo "== $r $s $e $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/run.log
   (cd /tmp/$e && python -m tools.trace_cost --schedule=$s $extra --micro_batches=4,32 --modes=loop --steps=9 --warmup=2 > $out/$r-$s-$e.log 2>&1)
  done
 done
done
echo "end $(date +%T)" >> $out/run.log
