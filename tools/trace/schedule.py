"""Draws the schedule of a real pipelined training step, as the GPipe paper's Figure 2c, for any schedule.

Runs a few training steps of a stack of FC blocks through PipeliningLayer with
a ScheduleTrace (gpipe_tf.pipeline.trace), takes the timestamps of the last
step and

  * prints an ASCII timeline, one row per device (forwards as micro-batch
    digits, backwards as letters, weight-gradient passes as capitals), and
    the measured bubble fraction beside the simulated one (the schedule
    replayed with unit-time passes, Timeline.SimulatedBubble), and how busy
    the process kept the machine's cores (process CPU time over cores x wall
    time): where logical devices share the cores (a split CPU), a device's
    idle time is not the cores', so it is the cores' that costs time;
  * writes a PNG (matplotlib), one row per device, every action a bar
    labelled by its pass and micro-batch (and stage when a device holds
    several);
  * with --chrome_trace=PATH, writes the Chrome-trace JSON (one track per
    device; open it in ui.perfetto.dev or chrome://tracing).

The step goes through ``PipeliningLayer.ComputeLossAndGradients`` (the loss
inside the pipeline, per example) when the schedule needs it (every schedule
but fill-drain 'gpipe'), else through FProp and a GradientTape. A schedule is
a registered name (--schedule, --virtual_stages) or a CSV file
(--schedule_csv, gpipe_tf.pipeline.schedule.Dump's format), which then sets K,
M and V.

    python -m tools.trace.schedule --schedule=1f1b --partitions=2 \\
        --micro_batches=4 --out=schedule.png --chrome_trace=trace.json
    python -m tools.trace.schedule --schedule=interleaved_1f1b \\
        --virtual_stages=2 --micro_batches=4
    python -m tools.trace.schedule --schedule_csv=my_schedule.csv
    python -m tools.trace.schedule --schedule=zb_h1 --devices=processes

--devices=processes runs each device's cells in a local worker process of
its own (gpipe_tf.runtime.local_workers: pinned to its own core, one
intra-op thread), as accelerators run them, instead of on logical devices
sharing the process's thread pool (--devices=shared, the default); the
report then also gives each worker's CPU time over the wall time, and
--profile=DIR profiles the workers (tools/trace/worker_profile.py: each worker's
ops, and how long its sends waited after the action that made them).
--execution builds the step another way (e.g. 'unrolled' beside the default
'loop') to see where one build waits that another does not.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple, Sequence

from absl import app
from absl import flags
import tensorflow as tf

# Imports TensorFlow but runs no op: main splits the CPU before the first one.
from gpipe_tf.runtime import devices as devices_lib
from gpipe_tf.runtime import local_workers
from gpipe_tf import layers
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline import trace as trace_lib
from tools.trace import worker_profile
from tools.trace import waits as waits_lib

__all__ = ['Draw', 'Report', 'Trace', 'Traced', 'main']

_SCHEDULE = flags.DEFINE_string(
    'schedule', 'gpipe', 'Registered schedule: gpipe, 1f1b, interleaved_1f1b, '
    'zb_h1 (gpipe_tf.pipeline.schedule.Names()).')
_VIRTUAL_STAGES = flags.DEFINE_integer(
    'virtual_stages', 1, 'V: cells per device (interleaved schedules).')
_SCHEDULE_CSV = flags.DEFINE_string(
    'schedule_csv', None, 'Draw this hand-written schedule (CSV, '
    'schedule.Dump format) instead of --schedule; it sets K, M and V.')
_K = flags.DEFINE_integer('partitions', 2, 'K: devices.')
_M = flags.DEFINE_integer('micro_batches', 4, 'M: micro-batches.')
_REMAT = flags.DEFINE_enum('remat', 'always', ['always', 'except_last', 'never'],
                           'Remat policy.')
_BLOCK = flags.DEFINE_enum(
    'block', 'fc', ['fc', 'transformer'], "Kind of block: 'fc' (FC layers "
    "of --dim) or 'transformer' (encoder blocks of model width --dim, 4 "
    "heads, on sequences of --seq_len).")
_NUM_BLOCKS = flags.DEFINE_integer('num_blocks', 16, 'Blocks.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', 32, 'Transformer sequence length.')
_WAITS = flags.DEFINE_integer(
    'waits', 0, 'Also print each device\'s longest N waits: the idle time '
    'before an action, what it waited for and when that ended.')
_DIM = flags.DEFINE_integer('dim', 256, 'Width.')
_BATCH = flags.DEFINE_integer('batch_size', 1024, 'Mini-batch size.')
_OUT = flags.DEFINE_string('out', 'schedule.png', 'PNG to write; empty: none.')
_CHROME_TRACE = flags.DEFINE_string(
    'chrome_trace', None, 'Also write the Chrome-trace / Perfetto JSON here.')
_DEVICES = flags.DEFINE_enum(
    'devices', 'shared', ['shared', 'processes'],
    "'shared': one process, logical devices sharing one thread pool; "
    "'processes': one local worker process per device, each pinned to its "
    'own core with one intra-op thread.')
_PROFILE = flags.DEFINE_string(
    'profile', None, 'With --devices=processes: also profile the workers '
    "(TensorFlow's profiler) over a few more steps, write one .xplane.pb a "
    'worker under this directory, and print how long each worker\'s sends '
    'waited after the action that made them (tools/trace/worker_profile.py).')
_EXECUTION = flags.DEFINE_enum(
    'execution', 'loop', ['loop', 'folded', 'switch', 'unrolled'],
    "How the step's graph is built (PipeliningLayer's execution): the "
    "default 'loop', or 'unrolled' to see where a loop waits that every "
    'tick built on its own does not.')

_COLORS = {schedule_lib.F: '#4c78a8', schedule_lib.B: '#f58518',
           schedule_lib.BW: '#e45756', schedule_lib.W: '#54a24b'}


class Traced(NamedTuple):
  """What Trace measured.

  Attributes:
    timeline: the last traced step's timeline.
    devices: the K devices' names.
    cores_busy: the process's CPU time over (cores x wall time) during
      ``steps`` more steps: 1.0 when every core worked all the time. Threads
      that spin while they wait for work count as busy. With worker
      processes, theirs (this process only drives the step).
    workers_busy: with worker processes, each one's CPU time over the wall
      time of those steps (one core each: at most 1.0); else None.
    profiles: with a profile directory, each worker's profiled steps.
  """
  timeline: trace_lib.Timeline
  devices: list[str]
  cores_busy: float
  workers_busy: list[float] | None = None
  profiles: list[worker_profile.WorkerProfile] | None = None


def _Cores() -> int:
  if hasattr(os, 'sched_getaffinity'):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def Trace(schedule: str | schedule_lib.Schedule, num_partitions: int,
          num_micro_batches: int, num_virtual_stages: int = 1,
          remat: str = 'always', num_blocks: int = 16, dim: int = 256,
          batch_size: int = 1024, steps: int = 3,
          workers: local_workers.LocalWorkers | None = None,
          devices: Sequence[str] | None = None, block: str = 'fc',
          seq_len: int = 32, execution: str = 'loop',
          profile_dir: str | None = None) -> Traced:
  """Runs ``steps`` traced training steps, keeps the last one's timeline,
  then times ``steps`` more for how busy they keep the cores.

  Args:
    schedule: a registered name or a Schedule (whose K, M and V must agree
      with the other arguments).
    num_partitions, num_micro_batches, num_virtual_stages, remat: the
      PipeliningLayer's K, M, V and remat policy.
    num_blocks, dim, batch_size: the model (blocks of width ``dim``) and
      the mini-batch.
    steps: steps to run (the first ones warm up).
    workers: the local worker processes the cells run on (connected), whose
      CPU time is read; ``devices`` then their devices.
    devices: the K devices; default the first K default devices (split the
      CPU first on a CPU-only host).
    block: 'fc' (FC layers without activation) or 'transformer' (encoder
      blocks, 4 heads, hidden 4 x dim, on ``seq_len`` tokens).
    execution: the PipeliningLayer's execution (how the graph is built).
    profile_dir: with ``workers``, also profile them over ``steps`` + 2
      more steps (worker_profile.Capture) and write their profiles here.

  Returns:
    Traced.
  """
  if block == 'fc':
    blocks = [layers.FCLayer.Params().Set(name=f'block{i}', input_dim=dim,
                                          output_dim=dim)
              for i in range(num_blocks)]
  else:
    blocks = [layers.TransformerEncoderLayer.Params().Set(
        name=f'block{i}', model_dim=dim, hidden_dim=4 * dim, num_heads=4)
              for i in range(num_blocks)]
  pipe = PipeliningLayer.Params().Set(
      name='net', layers=blocks, num_partitions=num_partitions,
      num_micro_batches=num_micro_batches, remat=remat, schedule=schedule,
      num_virtual_stages=num_virtual_stages, execution=execution,
      input_shapes=([(None, dim)] if block == 'fc' else
                    [(None, seq_len, dim), (None, seq_len)]),
      devices=list(devices) if devices else None).Instantiate()
  with tf.device(pipe.devices[0]):  # Where cell 0 runs.
    if block == 'fc':
      x = tf.random.stateless_normal([batch_size, dim], [1, 2])
    else:
      x = (tf.random.stateless_normal([batch_size, seq_len, dim], [1, 2]),
           tf.zeros([batch_size, seq_len]))
    labels = tf.zeros([batch_size])  # Unused by the loss; split like x.
  trace = trace_lib.ScheduleTrace()

  def _Step():
    if pipe.needs_loss_inside:
      _, _, grads = pipe.ComputeLossAndGradients(x, labels, _PerExampleLoss,
                                                 trace=trace)
    else:
      with tf.GradientTape() as tape:
        out = pipe.FProp(*(x if isinstance(x, tuple) else (x,)),
                         training=True, trace=trace)
        loss = tf.reduce_mean(tf.square(_First(out)))
      grads = tape.gradient(loss, pipe.trainable_variables)
    return [tf.reduce_sum(g) for g in grads], trace.Tensors()

  step = trace_lib.TracedStep(_Step)
  for _ in range(steps):  # Warm up; keep the last step.
    _, (starts, ends) = step()
  timeline = trace_lib.Timeline.FromValues(trace, starts.numpy(), ends.numpy())
  own = workers.CpuSeconds if workers else lambda: [time.process_time()]
  wall, cpu = time.perf_counter(), own()
  for _ in range(steps):
    step()[1][1].numpy()
  wall, cpu = time.perf_counter() - wall, [b - a for a, b in zip(cpu, own())]
  profiles = None
  if profile_dir and workers:
    more = steps + 2  # Summarize keeps the steps whose next one is profiled.
    paths = worker_profile.Capture(
        workers.cluster.workers,
        lambda: [step()[1][1].numpy() for _ in range(more)], profile_dir,
        duration_ms=int(1000 * (2.0 + 2 * more * wall / steps)))
    profiles = [worker_profile.Summarize(f'worker {i}',
                                         *worker_profile.Read(path))
                for i, path in enumerate(paths)]
  return Traced(timeline, pipe.devices, sum(cpu) / (wall * _Cores()),
                [c / wall for c in cpu] if workers else None, profiles)


def DeviceBusy(timeline: trace_lib.Timeline) -> list[float]:
  """Each device's busy share of the makespan: the union of its actions'
  intervals over the makespan (1 - the mean is the bubble fraction)."""
  return [b / timeline.makespan for b in timeline.DeviceBusy()]


def _First(outputs):
  """A block's output tensor (a Transformer block returns its paddings
  beside it)."""
  return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def _PerExampleLoss(outputs, labels):
  del labels
  y = _First(outputs)
  loss = tf.reduce_mean(tf.square(y), axis=-1)
  while loss.shape.rank > 1:  # A Transformer's: one term per example.
    loss = tf.reduce_mean(loss, axis=-1)
  return loss_lib.LossTerms(loss)


def Report(timeline: trace_lib.Timeline,
           cores_busy: float | None = None,
           workers_busy: Sequence[float] | None = None) -> str:
  """The ASCII timeline, the measured bubble beside the simulated one, each
  device's busy share, and (if given) how busy the cores (or each worker
  process) were."""
  sched = timeline.schedule
  busy = '; devices busy (trace) ' + ' / '.join(
      f'{100 * b:.0f}%' for b in DeviceBusy(timeline))
  if cores_busy is not None:
    busy += f'; cores busy {100 * cores_busy:.0f}% of {_Cores()}'
  if workers_busy is not None:
    busy += ('; worker processes busy (CPU time / wall time) ' +
             ' / '.join(f'{100 * b:.0f}%' for b in workers_busy))
  return (f'{timeline.ToAscii()}\n'
          f'schedule {sched.name}: K={sched.num_devices} '
          f'M={sched.num_micro_batches} stages={sched.num_stages}; makespan '
          f'{1000 * timeline.makespan:.1f} ms, measured bubble '
          f'{timeline.BubbleFraction():.2f}, simulated (unit-time F, B, W) '
          f'{timeline.SimulatedBubble():.2f}{busy}')


def Draw(timeline: trace_lib.Timeline, device_names: Sequence[str],
         path: str) -> None:
  """Writes a PNG of the timeline: one row per device, one bar per action."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  sched = timeline.schedule
  k = sched.num_devices
  several = sched.num_stages > k
  fig, ax = plt.subplots(figsize=(12, 0.8 * k + 1.2))
  for a, s, e in zip(timeline.actions, timeline.start, timeline.end):
    row = k - 1 - sched.DeviceOf(a.stage)
    ax.barh(row, (e - s) * 1000, left=s * 1000, height=0.8,
            color=_COLORS[a.kind], edgecolor='black', linewidth=0.5)
    ax.text((s + e) * 500, row, a.stage_label if several else a.label,
            ha='center', va='center', fontsize=6, color='white')
  ax.set_yticks(range(k))
  ax.set_yticklabels([f'device {d} ({device_names[d].split("/")[-1]})'
                      for d in reversed(range(k))])
  ax.set_xlabel('time (ms)')
  ax.set_title(f'{sched.name}, K={k}, M={sched.num_micro_batches}, '
               f'{sched.num_stages} stages: measured bubble '
               f'{timeline.BubbleFraction():.2f}, simulated '
               f'{timeline.SimulatedBubble():.2f}')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  schedule, k, m, v = (_SCHEDULE.value, _K.value, _M.value,
                       _VIRTUAL_STAGES.value)
  if _SCHEDULE_CSV.value:
    schedule = schedule_lib.Load(_SCHEDULE_CSV.value)
    schedule.Validate()
    k, m = schedule.num_devices, schedule.num_micro_batches
    v = schedule.num_stages // k
  args = (schedule, k, m, v, _REMAT.value, _NUM_BLOCKS.value, _DIM.value,
          _BATCH.value)
  model = dict(block=_BLOCK.value, seq_len=_SEQ_LEN.value,
               execution=_EXECUTION.value)
  if _PROFILE.value and _DEVICES.value != 'processes':
    raise app.UsageError('--profile profiles worker processes: add '
                         '--devices=processes.')
  if _DEVICES.value == 'processes':
    with local_workers.LocalWorkers(
        local_workers.Options(num_workers=k)) as workers:
      print(f'--devices=processes: {workers.Describe()}', flush=True)
      traced = Trace(*args, workers=workers, devices=workers.Connect(),
                     profile_dir=_PROFILE.value, **model)
  else:
    devices_lib.SplitCpu(k)
    traced = Trace(*args, **model)
  timeline, device_names = traced.timeline, traced.devices
  print(Report(timeline, traced.cores_busy, traced.workers_busy))
  if _WAITS.value:
    print(waits_lib.WaitReport(timeline, _WAITS.value))
  if traced.profiles:
    print(f'profile ({_PROFILE.value}): what each worker ran, and how long '
          'its sends waited after the action that made them')
    print(worker_profile.Report(traced.profiles))
  if _OUT.value:
    Draw(timeline, device_names, _OUT.value)
    print(f'wrote {_OUT.value}')
  if _CHROME_TRACE.value:
    timeline.WriteChromeTrace(_CHROME_TRACE.value)
    print(f'wrote {_CHROME_TRACE.value} (open it in ui.perfetto.dev)')


if __name__ == '__main__':
  app.run(main)
