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
inter-op threads = devices). tools/benchmark/lib.py builds and times the steps.

Every configuration is also compared with a single-core baseline: a plain
SequentialLayer on one device with one thread in total (intra-op = inter-op =
1), timed in a child process of its own (thread pools are fixed per process)
whose rounds are interleaved with the grid's (tools/benchmark/baseline.py).
Each row's examples/sec over the baseline's (of the same mode, training or
inference) is its ``x single-core``; on C cores C x is the physical limit.
The target checks also give the best row's ratio in every round (baseline
round r against grid round r) and in how many rounds it met the target:
steps here move by up to 20% between runs, and --rounds=N narrows the median.
--nocompare_single_core leaves the baseline out.

--schedules=gpipe,1f1b,interleaved_1f1b,zb_h1 times every pipelined training
configuration under each schedule (gpipe_tf.pipeline.schedule; the
'interleaved_1f1b' rows with --virtual_stages cells per device). Schedules
other than 'gpipe' need the loss inside the pipeline, so with any of them
every pipelined training row (gpipe's included) runs
PipeliningLayer.ComputeLossAndGradients with the same loss as per-example
terms, and the tables say which path each row took; the default, just
'gpipe', keeps FProp + GradientTape. Inference and --replicas rows use
'gpipe'.

Prints the paper's Table 2 (throughput normalised to K=2, M=1 with the same
remat policy, beside the bubble-bound ideal K*M/(M+K-1)) and Table 1 (peak
memory, examples/sec and x single-core), the target checks, the best
ratios to the single-core baseline beside their targets, and with --replicas
the R x K table (throughput normalised to R=1, K=D at the first M of the same
remat); with more than one schedule, the per-schedule table (schedule x remat
x M at K=2: examples/sec, x single-core, peak MiB). Table 2 and the targets
read the 'gpipe' rows. --json PATH writes one row per configuration (the
baseline's rows have ``single_core`` true; every row has
``speedup_vs_single_core``, ``speedup_rounds``, ``seconds_per_step_rounds``,
``schedule``, ``num_virtual_stages``, ``loss_inside``, and the memory model's
``model_peak_bytes`` (over the traced step's sizes), each device's own
modelled peak ``device_model_peak_bytes`` (printed beside each worker's
measured peak with --devices=processes) and ``plan_peak_bytes`` (over
tools.plan's estimate of the sizes)).

Threads: by default each of the D logical devices gets cores // D intra-op
threads and there are D inter-op threads (gpipe_tf.runtime.devices.SplitCpu),
i.e. as many busy threads as cores. --intra_op_threads and --inter_op_threads
override them for the grid (never for the baseline).

Peak memory is the most the process allocator held during one step beyond what
it held before the step (activations, gradients, temporaries; the weights and
optimizer slots are allocated before and are not included). All logical CPU
devices share one allocator, so this is the total over all cells and replicas.

--devices=processes puts each of the D devices in a local worker process of
its own instead (gpipe_tf.runtime.local_workers: pinned to its own core, one
intra-op thread; --intra_op_threads and --inter_op_threads set the workers'),
this process driving every step as the cluster's chief: a device that waits
then leaves its core idle, as an accelerator does. One replica only. Every
row then also has per-device figures (tools/benchmark/processes.py: busy
time, peak memory of each worker's own allocator, bytes sent, the schedule's
boundary bytes), printed as a per-device table. --predict adds the
simulator's step from each row's measured F, B and W costs beside the
measured step, and the bubbles (tools/benchmark/predict.py).

    python -m tools.benchmark                      # 32 FC blocks, K in {1,2}
    python -m tools.benchmark --block=transformer  # 32 Transformer blocks
    python -m tools.benchmark --replicas=1,2       # also 1 x 2 vs 2 x 1
    python -m tools.benchmark --partitions=2 --micro_batches=8 \
        --remat=never,always --noinference         # just the targets' rows
    python -m tools.benchmark --partitions=2 --micro_batches=4,8 \
        --remat=never,always --noinference \
        --schedules=gpipe,1f1b,interleaved_1f1b,zb_h1
    python -m tools.benchmark --devices=processes --partitions=2 \
        --micro_batches=8 --remat=never --noinference --schedules=1f1b,zb_h1
    python -m tools.benchmark --devices=processes --predict ...  # the same,
        # with the simulator's step from the measured F, B and W costs
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from absl import app
from absl import flags
import tensorflow as tf


# Imports TensorFlow but runs no op: main splits the CPU before the first one.
from gpipe_tf.runtime import devices
from gpipe_tf.runtime import local_workers
from tools.benchmark import baseline as baseline_lib
from tools.benchmark import lib
from tools.benchmark import processes as processes_lib
from tools.benchmark import tables

__all__ = ['main']

_BLOCK = flags.DEFINE_enum('block', 'fc', ['fc', 'transformer'],
                           'Kind of the identical blocks.')
_NUM_BLOCKS = flags.DEFINE_integer('num_blocks', 32, 'Number of blocks (L).')
_DIM = flags.DEFINE_integer('dim', 256, 'Model width.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', 32, 'Transformer sequence length.')
_BATCH = flags.DEFINE_integer('batch_size', 2048,
                              'Mini-batch size N (sequences for transformer).')
_NUM_DEVICES = flags.DEFINE_integer(
    'num_devices', 2, 'D: devices (logical CPU devices, or worker processes '
    'with --devices=processes).')
_DEVICES = flags.DEFINE_enum(
    'devices', processes_lib.SHARED, list(processes_lib.MODES),
    "What a device is. 'shared': " + processes_lib.Mode(processes_lib.SHARED)
    + " (the CPU split into logical devices). 'processes': "
    + processes_lib.Mode(processes_lib.PROCESSES) + ' (local serve_worker '
    'processes; this process drives the step). --replicas needs shared.')
_PARTITIONS = flags.DEFINE_list('partitions', ['1', '2'], 'Values of K.')
_MICRO = flags.DEFINE_list('micro_batches', ['1', '2', '4', '8'],
                           'Values of M.')
_REMAT = flags.DEFINE_list('remat', ['never', 'always', 'except_last'],
                           'Remat policies.')
_SCHEDULES = flags.DEFINE_list(
    'schedules', ['gpipe'],
    "Pipeline schedules (gpipe_tf.pipeline.schedule.Names()), or 'auto' "
    "(PipeliningLayer schedule='auto' within 1F1B's modelled peak; each "
    "row's 'auto' field says what it chose). With any but "
    "'gpipe', every pipelined training row takes the loss-inside path "
    '(ComputeLossAndGradients), gpipe\'s too.')
_VIRTUAL_STAGES = flags.DEFINE_integer(
    'virtual_stages', 2, "V, cells per device, of the 'interleaved_1f1b' rows.")
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
_COMPARE_SINGLE_CORE = flags.DEFINE_bool(
    'compare_single_core', True,
    'Also time the single-core baseline in a child process, interleaved '
    'with the grid, and print every row as a ratio to it.')
_SINGLE_CORE_BASELINE = flags.DEFINE_bool(
    'single_core_baseline', False,
    'Internal: be the single-core baseline child process (one device, one '
    'thread), timing a round per "round" line on stdin.')
_INTRA_OP = flags.DEFINE_integer(
    'intra_op_threads', 0, 'Intra-op threads of the grid; 0: cores // D.')
_INTER_OP = flags.DEFINE_integer(
    'inter_op_threads', 0, 'Inter-op threads of the grid; 0: D.')
_PREDICT = flags.DEFINE_bool(
    'predict', False,
    'With --devices=processes: time every pipelined training row\'s F, B '
    'and W pieces on its workers after the rounds and print the simulator\'s '
    'step and bubble from them beside the measured ones '
    '(tools/benchmark/predict.py).')
_DTYPES = flags.DEFINE_list(
    'dtype', ['float32'],
    "Precision policies of the rows, side by side: 'float32', "
    "'mixed_bfloat16', 'mixed_float16' (gpipe_tf.layers.precision).")
_ACCUMULATION = flags.DEFINE_bool(
    'accumulation', False,
    'Also time a SequentialLayer running the M micro-batches in turn '
    '(gradient accumulation) for each M > 1; with --devices=processes, '
    "table every pipelined row's summed device busy time against it.")
_JIT = flags.DEFINE_bool(
    'jit_compile', False,
    'Also time every pipeline row with its pieces compiled by XLA, beside '
    'the plain row.')
_EXECUTIONS = flags.DEFINE_list(
    'execution', ['loop'],
    "The executions to time (PipeliningLayer.execution): 'loop', "
    "'unrolled', 'folded', 'switch'.")


def main(argv):
  del argv
  spec = lib.ModelSpec(block=_BLOCK.value, num_blocks=_NUM_BLOCKS.value,
                       dim=_DIM.value, seq_len=_SEQ_LEN.value,
                       batch_size=_BATCH.value)
  if _SINGLE_CORE_BASELINE.value:
    devices.SplitCpu(1, intra_op_threads=1, inter_op_threads=1)
    baseline_lib.Serve(spec, _STEPS.value, _INFERENCE.value, sys.stdin,
                       sys.stdout)
    return
  if _DEVICES.value == processes_lib.PROCESSES:
    options = local_workers.Options(
        num_workers=_NUM_DEVICES.value,
        intra_op_threads=_INTRA_OP.value or 1,
        inter_op_threads=_INTER_OP.value or 2)
    with local_workers.LocalWorkers(options) as workers:
      print(f'--devices=processes: {workers.Describe()}', flush=True)
      _Run(spec, workers, workers.Connect(),
           dict(intra_op_threads=options.intra_op_threads,
                inter_op_threads=options.inter_op_threads))
    return
  devices.SplitCpu(_NUM_DEVICES.value, _INTRA_OP.value or None,
                   _INTER_OP.value or None)
  _Run(spec, None, None, dict(
      intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads(),
      inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads()))


def _Run(spec, workers, worker_devices, threads):
  """Measures the grid and prints the tables; on worker processes when
  ``workers`` (local_workers.LocalWorkers, cells on ``worker_devices``)."""
  mode = processes_lib.PROCESSES if workers else processes_lib.SHARED
  configs = lib.Merge(
      lib.PipelineConfigs(_Ints(_PARTITIONS), _Ints(_MICRO), _REMAT.value,
                          _INFERENCE.value, _SCHEDULES.value,
                          _VIRTUAL_STAGES.value, _DTYPES.value,
                          (False, True) if _JIT.value else (False,),
                          _EXECUTIONS.value),
      lib.ReplicaConfigs(_NUM_DEVICES.value, _Ints(_REPLICAS), _Ints(_MICRO),
                         _REMAT.value, _BATCH.value,
                         lib.LossInside(_SCHEDULES.value)),
      lib.AccumulationConfigs(_Ints(_MICRO), _DTYPES.value)
      if _ACCUMULATION.value else [])
  measure = None
  if workers:

    def measure(also_time):
      return processes_lib.Measure(spec, configs, workers, worker_devices,
                                   _ROUNDS.value, _STEPS.value,
                                   also_time=also_time,
                                   predict=_PREDICT.value)
  load = [os.getloadavg()[0]]
  if _COMPARE_SINGLE_CORE.value:
    rows, baseline_rounds = baseline_lib.MeasureWithBaseline(
        spec, configs, _NUM_DEVICES.value, _ROUNDS.value, _STEPS.value,
        _INFERENCE.value, measure)
  elif measure:
    rows, baseline_rounds = measure(()), []
  else:
    rows, baseline_rounds = lib.Measure(
        spec, configs, _NUM_DEVICES.value, _ROUNDS.value, _STEPS.value), []
  load.append(os.getloadavg()[0])
  rows = tables.WithSpeedups(rows)
  per = 'per worker' if workers else 'in the one process'
  print(f'\n{_NUM_BLOCKS.value} x {_BLOCK.value} blocks, dim {_DIM.value}, '
        f'batch {_BATCH.value}, {_NUM_DEVICES.value} devices: '
        f'--devices={mode} ({processes_lib.Mode(mode)}); '
        f"{os.cpu_count()} cores, {threads['intra_op_threads']} intra-op and "
        f"{threads['inter_op_threads']} inter-op threads {per}; 1-minute load "
        f'average {load[0]:.1f} before, {load[1]:.1f} after (this run counts '
        'too; other load slows multi-threaded rows more than the baseline)\n')
  partitions, micro = _Ints(_PARTITIONS), _Ints(_MICRO)
  print(tables.Table2(rows, partitions, micro, _REMAT.value, _INFERENCE.value))
  print(tables.Table1(rows))
  print(tables.Targets(rows, partitions, micro))
  print(tables.SingleCoreTargets(rows, os.cpu_count() or 1, baseline_rounds))
  if len(_SCHEDULES.value) > 1:
    print(tables.ScheduleTable(rows, micro, _REMAT.value))
  if workers:
    print(tables.DeviceTable(rows))
    if _ACCUMULATION.value:
      print(tables.AccumulationTable(rows))
  if _PREDICT.value and workers:
    print(tables.PredictionTable(rows))
  if _REPLICAS.value:
    print(tables.ReplicaTable(rows, _NUM_DEVICES.value, _Ints(_REPLICAS), micro,
                              _REMAT.value))
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(dict(dataclasses.asdict(spec), num_devices=_NUM_DEVICES.value,
                     devices=mode, **threads, load_average_before_after=load,
                     single_core_examples_per_sec_rounds=baseline_rounds,
                     rows=rows), f, indent=1)


def _Ints(flag):
  return [int(v) for v in flag.value]

