"""Times the benchmark's steps with each cell in a worker process of its own, and reads every worker's figures.

``--devices=processes`` of tools.benchmark, tools.trace.schedule and
tools.plan --compare: the K cells run on K local worker processes
(gpipe_tf.runtime.local_workers: worker k pinned to core k, one intra-op
thread), this process is the chief that drives the step. Besides the step
time of every configuration, each row then holds per-device figures:

  * ``device_busy_seconds_per_step``: each worker's CPU time per step (user +
    system, all its threads, from /proc; on a worker pinned to one core with
    one intra-op thread, the time its device computed or moved data);
  * ``device_peak_memory_bytes``: the most each worker's own allocator held
    during one step beyond what it held before (its cell's activations,
    gradients and temporaries);
  * ``device_bytes_sent_per_step``: the bytes each worker sent over its TCP
    connections per step (kernel socket counters, gRPC framing included);
  * ``chief_busy_seconds_per_step``: this process's CPU time per step
    (it drives the step over gRPC; it is not pinned and shares the cores);
  * ``boundary_bytes_per_step``: what the schedule says must cross a device
    boundary per step (an F whose next stage is on another device sends its
    output, a backward whose previous stage is on another device sends its
    input gradient), from the boundary tensor's size;
  * with ``predict``, ``prediction``: every stage's F, B, W and BW pieces
    (the engine's) timed on its worker by the worker's CPU time, the step
    and bubble the schedule replayed on them predicts, and the measured
    bubble from the busy times (tools/benchmark/predict.py).

The shared mode (``--devices=shared``, the default) runs every cell in ONE
process, on logical devices that share one thread pool and one allocator;
``Mode`` names both as the tables label them.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import sys
import time
from typing import Callable, Sequence

from gpipe_tf.pipeline import schedule as schedule_lib
from tools.benchmark import lib
from tools.benchmark import predict as predict_lib

__all__ = ['SHARED', 'PROCESSES', 'MODES', 'Mode', 'BoundaryBytes',
           'Measure', 'Prediction']

SHARED = 'shared'
PROCESSES = 'processes'
MODES = (SHARED, PROCESSES)
_LABELS = {
    SHARED: 'one process, logical devices sharing one thread pool',
    PROCESSES: 'one worker process per device, each pinned to its own core '
               'with one intra-op thread',
}


def Mode(name: str) -> str:
  """The label of a --devices mode, as the tools print it.

  Raises:
    ValueError: not one of MODES.
  """
  if name not in _LABELS:
    raise ValueError(f'--devices={name!r}; use one of {", ".join(MODES)}.')
  return _LABELS[name]


def ExampleBytes(spec: lib.ModelSpec) -> int:
  """Pure: bytes of one example's boundary tensors (every block keeps the
  input's shape: FC (dim,), Transformer (seq_len, dim) and its (seq_len,)
  padding), float32."""
  if spec.block == 'fc':
    return 4 * spec.dim
  return 4 * spec.seq_len * (spec.dim + 1)


def BoundaryBytes(schedule: schedule_lib.Schedule, micro_batch_bytes: int
                  ) -> int:
  """Pure: the bytes one step of `schedule` sends between devices.

  Every F of a stage whose next stage sits on another device sends its output
  there; every B or BW of a stage whose previous stage sits on another
  device sends its input gradient back (W sends nothing). Each crossing moves
  one micro-batch's boundary tensors, ``micro_batch_bytes``.
  """
  last = schedule.num_stages - 1
  crossings = 0
  for row in schedule.actions:
    for a in row:
      if a.kind == schedule_lib.F and a.stage < last:
        crossings += schedule.DeviceOf(a.stage) != schedule.DeviceOf(
            a.stage + 1)
      elif a.kind in (schedule_lib.B, schedule_lib.BW) and a.stage > 0:
        crossings += schedule.DeviceOf(a.stage) != schedule.DeviceOf(
            a.stage - 1)
  return crossings * micro_batch_bytes


def RowBoundaryBytes(spec: lib.ModelSpec, cfg: dict) -> int | None:
  """BoundaryBytes of a pipelined training row (None for any other row)."""
  if not cfg['pipeline'] or cfg['mode'] != 'train':
    return None
  schedule, _ = lib.RowLayout(spec, cfg)
  return BoundaryBytes(schedule, spec.batch_size // cfg['num_micro_batches']
                       * ExampleBytes(spec))


def Measure(spec: lib.ModelSpec, configs: Sequence[dict], workers,
            devices: Sequence[str], rounds: int, steps_per_round: int,
            log: Callable[[str], None] | None = None,
            also_time: Sequence[Callable[[], None]] = (),
            predict: bool = False) -> list[dict]:
  """lib.Measure on worker processes, with every row's per-device figures.

  Args:
    spec: the model and global batch.
    configs: configurations (lib.Config dicts) of one replica.
    workers: the running local_workers.LocalWorkers (this process connected
      to them); ``devices`` their devices, cell k on ``devices[k]``.
    rounds, steps_per_round, log, also_time: as lib.Measure.
    predict: also time every pipelined training row's pieces on the
      workers, after the rounds, and add its ``prediction`` (module
      docstring).

  Returns:
    lib.Measure's rows, each with the figures of the module docstring (the
    lists hold one value per worker); ``peak_memory_bytes`` is the sum of the
    workers' peaks (the shared mode's one allocator holds all of them).

  Raises:
    ValueError: a configuration with R > 1 (one replica only here).
  """
  log = log or (lambda line: print(line, file=sys.stderr, flush=True))
  if any(cfg['num_replicas'] > 1 for cfg in configs):
    raise ValueError('--devices=processes times one replica; leave out '
                     '--replicas (or use --devices=shared).')

  def _WorkerPeaks(step):
    before = workers.Memory(reset=True)
    step().numpy()
    return [a['peak'] - b['current'] for a, b in zip(workers.Memory(), before)]

  cpu = [[0.0] * len(devices) for _ in configs]
  sent = [[0] * len(devices) for _ in configs]
  chief = [0.0 for _ in configs]

  @contextlib.contextmanager
  def _Counting(i):
    """Adds the workers' CPU time and bytes sent, and this process's CPU
    time, over one timed round of configuration i."""
    cpu0, sent0 = workers.CpuSeconds(), workers.BytesSent()
    own = time.process_time()
    yield
    chief[i] += time.process_time() - own
    cpu[i] = [t + b - a for t, a, b in zip(cpu[i], cpu0,
                                             workers.CpuSeconds())]
    sent[i] = [t + b - a for t, a, b in zip(sent[i], sent0,
                                             workers.BytesSent())]

  rows, peaks = lib.TimedRows(spec, configs, devices, rounds,
                              steps_per_round, log, also_time, _WorkerPeaks,
                              _Counting)
  total_steps = rounds * steps_per_round
  for row, cfg, p, c, s, own in zip(rows, configs, peaks, cpu, sent, chief):
    row.update(devices=PROCESSES, device_peak_memory_bytes=[int(x) for x in p],
               chief_busy_seconds_per_step=own / total_steps,
               device_busy_seconds_per_step=[x / total_steps for x in c],
               device_bytes_sent_per_step=[x // total_steps for x in s],
               boundary_bytes_per_step=RowBoundaryBytes(spec, cfg))
  if predict:
    clocks = [functools.partial(predict_lib.ThreadCpuSeconds, pid)
              for pid in workers.pids]
    pieces, comms = {}, {}
    # One set of pieces serves a stage's rows of every remat.
    remat = any(cfg['remat'] != 'never' for cfg in configs)
    for row, cfg in zip(rows, configs):
      if cfg['pipeline'] and cfg['mode'] == 'train':
        row['prediction'] = Prediction(spec, cfg, devices, clocks, pieces,
                                       comms, log, remat)
        # The mean step, as the busy times are means over the same rounds:
        # against the median, a slow round counted in the busy time only and
        # took a bubble below 0 (-0.09 once in CI).
        row['prediction']['measured_bubble'] = predict_lib.MeasuredBubble(
            row['device_busy_seconds_per_step'],
            statistics.mean(row['seconds_per_step_rounds']))
  return rows


def Prediction(spec: lib.ModelSpec, cfg: dict, devices: Sequence[str],
               clocks: Sequence[Callable[[], float]], pieces: dict,
               comms: dict, log: Callable[[str], None] = lambda line: None,
               remat: bool | None = None) -> dict:
  """benchmark_predict.Summary of a pipelined training row: its stages'
  pieces timed on their workers by the worker's CPU time (``clocks[d]``:
  device d's; ``pieces`` and ``comms`` cache them by blocks, micro-batch
  size and device, for the next rows; with ``remat`` their recomputing
  backwards too, default: when the row recomputes)."""
  k, m = cfg['num_partitions'], cfg['num_micro_batches']
  schedule, balance = lib.RowLayout(spec, cfg)
  n = spec.batch_size // m
  if remat is None:
    remat = cfg['remat'] != 'never'
  stage_pieces, stage_walls = [], []
  for s, blocks in enumerate(balance):
    d = schedule.DeviceOf(s)
    key = (blocks, n, devices[d])
    if key not in pieces or (remat and pieces[key][0].backward_remat is None):
      layer, inputs = lib.StageInputs(spec, blocks, n, devices[d])
      pieces[key] = predict_lib.MeasureCosts(layer.layers, inputs, devices[d],
                                             clocks[d], remat=remat)
      log(f'pieces of {blocks} blocks, {n} examples on {devices[d]} (CPU '
          f'time): {pieces[key][0]}; fastest wall: {pieces[key][1]}')
    stage_pieces.append(pieces[key][0])
    stage_walls.append(pieces[key][1])
  comm = predict_lib.Comm()
  if k > 1:
    if n not in comms:
      _, inputs = lib.StageInputs(spec, 1, n, devices[0])
      comms[n] = predict_lib.MeasureComm(inputs[0], devices[:2], clocks[:2])
      log(f'one message of {n} examples: {comms[n]}')
    comm = comms[n]
  return predict_lib.Summary(schedule, cfg['remat'], stage_pieces, comm,
                             stage_walls)
