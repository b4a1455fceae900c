"""Benchmarks a training step of a deep model over grids of K, M, remat and R, in one run.

Measures examples/sec of a full training step (forward + backward + one SGD
update) and the peak memory the step allocates, for:
  * a plain SequentialLayer baseline (no pipeline),
  * PipeliningLayer for every K in --partitions, M in --micro_batches and
    remat policy in --remat, and
  * with --replicas, the data-parallel R x K grid over the same D =
    --num_devices devices: for every R in --replicas, R replicas of a K = D/R
    cell pipeline under a MirroredStrategy (gpipe_tf.runtime.distribute), each
    pipelining its N/R share of the same global batch N over its own K
    devices with M micro-batches, one synchronous update per step,
all in ONE process, interleaved round by round (so a busy neighbour slows every
configuration alike), with the CPU split into --num_devices logical devices,
each given its share of the cores (intra-op threads = cores // devices,
inter-op threads = devices). tools/benchmark_lib.py builds and times the steps.

Prints the paper's Table 2 (throughput normalised to K=2, M=1 with the same
remat policy, beside the bubble-bound ideal K*M/(M+K-1)) and Table 1 (peak
memory), the target checks, and with --replicas the R x K table (throughput
normalised to R=1, K=D at the first M of the same remat). --json PATH writes
one row per configuration.

Peak memory is the most the process allocator held during one step beyond what
it held before the step (activations, gradients, temporaries; the weights and
optimizer slots are allocated before and are not included). All logical CPU
devices share one allocator, so this is the total over all cells and replicas.

    python -m tools.benchmark                      # 32 FC blocks, K in {1,2}
    python -m tools.benchmark --block=transformer  # 32 Transformer blocks
    python -m tools.benchmark --replicas=1,2       # also 1 x 2 vs 2 x 1
"""

from __future__ import annotations

import dataclasses
import json
import os

from absl import app
from absl import flags


# Imports TensorFlow but runs no op: main splits the CPU before the first one.
from gpipe_tf.runtime import devices
from tools import benchmark_lib as lib
from tools import benchmark_tables as tables

_BLOCK = flags.DEFINE_enum('block', 'fc', ['fc', 'transformer'],
                           'Kind of the identical blocks.')
_NUM_BLOCKS = flags.DEFINE_integer('num_blocks', 32, 'Number of blocks (L).')
_DIM = flags.DEFINE_integer('dim', 256, 'Model width.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', 32, 'Transformer sequence length.')
_BATCH = flags.DEFINE_integer('batch_size', 2048,
                              'Mini-batch size N (sequences for transformer).')
_NUM_DEVICES = flags.DEFINE_integer('num_devices', 2,
                                    'Logical CPU devices to split into.')
_PARTITIONS = flags.DEFINE_list('partitions', ['1', '2'], 'Values of K.')
_MICRO = flags.DEFINE_list('micro_batches', ['1', '2', '4', '8'],
                           'Values of M.')
_REMAT = flags.DEFINE_list('remat', ['never', 'always', 'except_last'],
                           'Remat policies.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds per configuration.')
_STEPS = flags.DEFINE_integer('steps_per_round', 2, 'Steps per timed round.')
_JSON = flags.DEFINE_string('json', None, 'Write result rows to this path.')
_REPLICAS = flags.DEFINE_list(
    'replicas', [],
    'Values of R for the data-parallel R x K grid (K = --num_devices / R); '
    'empty: no such grid.')
_INFERENCE = flags.DEFINE_bool(
    'inference', True,
    'Also time inference (forward only, training=False) for remat=never.')


def main(argv):
  del argv
  devices.SplitCpu(_NUM_DEVICES.value)

  spec = lib.ModelSpec(block=_BLOCK.value, num_blocks=_NUM_BLOCKS.value,
                       dim=_DIM.value, seq_len=_SEQ_LEN.value,
                       batch_size=_BATCH.value)
  configs = lib.Merge(
      lib.PipelineConfigs(_Ints(_PARTITIONS), _Ints(_MICRO), _REMAT.value,
                          _INFERENCE.value),
      lib.ReplicaConfigs(_NUM_DEVICES.value, _Ints(_REPLICAS), _Ints(_MICRO),
                         _REMAT.value, _BATCH.value))
  rows = lib.Measure(spec, configs, _NUM_DEVICES.value, _ROUNDS.value,
                     _STEPS.value)
  print(f'\n{_NUM_BLOCKS.value} x {_BLOCK.value} blocks, dim {_DIM.value}, '
        f'batch {_BATCH.value}, {_NUM_DEVICES.value} logical devices, '
        f'{os.cpu_count()} cores\n')
  partitions, micro = _Ints(_PARTITIONS), _Ints(_MICRO)
  print(tables.Table2(rows, partitions, micro, _REMAT.value, _INFERENCE.value))
  print(tables.Table1(rows))
  print(tables.Targets(rows, partitions, micro))
  if _REPLICAS.value:
    print(tables.ReplicaTable(rows, _NUM_DEVICES.value, _Ints(_REPLICAS), micro,
                              _REMAT.value))
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(dict(dataclasses.asdict(spec), num_devices=_NUM_DEVICES.value,
                     rows=rows), f, indent=1)


def _Ints(flag):
  return [int(v) for v in flag.value]


if __name__ == '__main__':
  app.run(main)
