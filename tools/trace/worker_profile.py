"""What each local worker ran, op by op: a TensorFlow profile of the workers of --devices=processes, and how long each device's sends waited.

In processes mode (gpipe_tf.runtime.local_workers) a device is a worker
process that runs its ops on one thread. A tensor that crosses to the next
device leaves through a ``_Send`` op that the graph partitioner adds after
the op that makes it, and the executor runs that Send on the same thread as
the device's compute: when it is not run at once, it waits until the thread
has nothing else to do, so the neighbour waits for data that was ready long
before (docs/performance.md, "Where a worker's sends wait"). The engine's
trace stamps (tools.trace.schedule) cannot show this; a profile of the
workers can:

  * ``Capture`` records a TensorFlow profile of every worker (the profiler
    service each worker's gRPC server runs) while the caller runs steps, and
    writes one ``.xplane.pb`` a worker (TensorBoard's profile plugin or
    xprof opens them);
  * ``Read`` takes a worker's ops from its file: start, duration, name and
    type, and when each call of the step's function began;
  * ``SendLags`` gives, for every Send of a tensor an action's piece made
    (introspect.FindActionScope: ``stage{s}_{kind}_mb{m}``, or
    ``_t{col}`` inside a loop of ticks), the time from the end of the
    action's last op to the Send;
  * ``Summarize`` and ``Report``: per worker, the step, its busy time (the
    union of its ops), the threads that ran them and its sends' lags.

Pure Python over the profile's protocol buffer except ``Capture``, which
runs the profiler client. What it does NOT do: tell why the executor ran an
op when it did (the profile has no reasons), or time anything but the
worker processes (the chief's dispatch is not in it).
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import statistics
import threading
import time
from typing import Callable, Sequence

from gpipe_tf import errors as errors_lib
from gpipe_tf.pipeline import introspect
from gpipe_tf.pipeline import trace as trace_lib
from gpipe_tf.pipeline.schedule import ticks

__all__ = ['NoProfileError', 'Op', 'SendLag', 'WorkerProfile', 'Capture',
           'Read', 'FromSpace', 'SendLags', 'Summarize', 'Report']


class NoProfileError(errors_lib.Error, RuntimeError):
  """The profiler wrote no profile file for a worker it was asked to trace."""


# An action's piece is a function call; TensorFlow inlines it under this.
_PIECE = '/StatefulPartitionedCall/'


@dataclasses.dataclass(frozen=True)
class Op:
  """One op a worker ran: start and duration in milliseconds (the
  profile's clock), the op's name, its type and the thread that ran it."""
  start: float
  ms: float
  name: str
  kind: str
  thread: str = ''

  @property
  def end(self) -> float:
    return self.start + self.ms

  @property
  def action(self) -> str | None:
    """The engine's action scope the op belongs to (``stage2_F_mb6``,
    ``stage0_BW_t11``), or None."""
    found = introspect.FindActionScope(self.name)
    # What a stage takes in at a tick (kind RECV) is no action's.
    return found.name if found and found.kind != ticks.RECV else None


@dataclasses.dataclass(frozen=True)
class SendLag:
  """A Send of a tensor an action made.

  Attributes:
    action: the action's scope.
    name: the Send op's name.
    at: when the Send started, milliseconds from its step's start.
    lag: milliseconds from the end of the action's last op to the Send.
  """
  action: str
  name: str
  at: float
  lag: float


@dataclasses.dataclass(frozen=True)
class WorkerProfile:
  """One worker's complete steps (the calls of the step's function whose
  next call the profile also holds).

  Attributes:
    name: the worker (its profile file's name).
    step_ms: per step, from its first op's start to its last op's end.
    busy_ms: per step, the union of its ops' intervals.
    lags: per step, its sends' lags.
    threads: how many threads ran its actions' ops over those steps (a
      worker runs a chief's ops on the threads the chief configured).
  """
  name: str
  step_ms: list[float]
  busy_ms: list[float]
  lags: list[list[SendLag]]
  threads: int = 0


def Capture(addresses: Sequence[str], run: Callable[[], None],
            logdir: str, duration_ms: int, delay_seconds: float = 1.0
            ) -> list[str]:
  """Profiles the workers at `addresses` ('host:port') while `run()` runs.

  The profiler records for `duration_ms` from when it starts; `run` starts
  `delay_seconds` later, in a thread of its own, and should end within the
  window (steps cut by its ends are left out by Summarize).

  Returns:
    The profile files written under `logdir`, one a worker, in the order of
    `addresses`.

  Raises:
    NoProfileError: the profiler wrote no file for some worker.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  errors = []

  def _Run():
    time.sleep(delay_seconds)
    try:
      run()
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  thread = threading.Thread(target=_Run, daemon=True)
  before = set(glob.glob(os.path.join(logdir, '**', '*.xplane.pb'),
                         recursive=True))
  thread.start()
  tf.profiler.experimental.client.trace(
      ','.join(f'grpc://{a}' for a in addresses), logdir, duration_ms)
  thread.join()
  if errors:
    raise errors[0]
  written = sorted(set(glob.glob(os.path.join(logdir, '**', '*.xplane.pb'),
                                 recursive=True)) - before)
  paths = []
  for address in addresses:
    mine = [p for p in written if os.path.basename(p).startswith(
        address.replace(':', '_') + '.')]
    if not mine:
      raise NoProfileError(
          f'The profiler wrote no profile for worker {address} under '
          f'{logdir} (wrote: {written}); is its server running?')
    paths.append(mine[-1])
  return paths


def Read(path: str) -> tuple[list[Op], list[float]]:
  """A worker's ops (sorted by start) and the starts of the step's function
  calls, in milliseconds, from its profile file."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  space = xplane_pb2.XSpace()
  with open(path, 'rb') as f:
    space.ParseFromString(f.read())
  return FromSpace(space)


def FromSpace(space) -> tuple[list[Op], list[float]]:
  """Read's work on a parsed XSpace: the host plane's TensorFlow ops
  ('name:Type' events) and the calls of a partitioned function (the
  engine's step on a worker)."""
  ops, starts = [], []
  for plane in space.planes:
    if plane.name != '/host:CPU':
      continue
    for line in plane.lines:
      for event in line.events:
        name = plane.event_metadata[event.metadata_id].name
        start = (line.timestamp_ns * 1000 + event.offset_ps) / 1e9
        if 'ExecuteAsync' in name and '_partitioned' in name:
          starts.append(start)
          continue
        op, sep, kind = name.rpartition(':')
        # Op events are 'name:Type'; the runtime's own ('Executor...',
        # 'ThreadpoolListener::Record', 'MemoryAllocation') are not ops.
        if (sep and op and kind and ' ' not in kind and '::' not in name and
            not name.startswith(('Executor', 'Memory', 'Eager'))):
          ops.append(Op(start, event.duration_ps / 1e9, op, kind, line.name))
  ops.sort(key=lambda o: o.start)
  return ops, sorted(starts)


def SendLags(ops: Sequence[Op]) -> list[SendLag]:
  """The lag of every Send of a tensor an action's piece made, in `ops`
  (one step of one worker, sorted by start; `at` from the first op): from
  the end of the latest op of the action that started before the Send.

  In a loop of ticks each Send of the body runs once more after the last
  iteration, for the loop's dead exit (no data, only its deadness): the
  last run of a loop body's Send is left out.
  """
  if not ops:
    return []
  t0 = ops[0].start
  runs: dict[str, int] = {}
  for op in ops:
    if op.kind == '_Send':
      runs[op.name] = runs.get(op.name, 0) + 1
  ended: dict[str, float] = {}
  seen: dict[str, int] = {}
  lags = []
  for op in ops:
    action = op.action
    if action is None:
      continue
    if op.kind != '_Send':
      ended[action] = max(ended.get(action, op.end), op.end)
      continue
    seen[op.name] = seen.get(op.name, 0) + 1
    dead = (_InLoop(op.name) and runs[op.name] > 1 and
            seen[op.name] == runs[op.name])
    if dead or not _MadeByPiece(op.name) or action not in ended:
      continue
    lags.append(SendLag(action, op.name, op.start - t0,
                        max(op.start - ended[action], 0.0)))
  return lags


def _InLoop(name: str) -> bool:
  return name.startswith('while') or '/while' in name


def _MadeByPiece(name: str) -> bool:
  """Whether a Send's tensor is one the action's piece computed: an op in
  the inlined body of its call, not the call's inputs passed through
  ('Func/.../input/') nor a slot the action read before it."""
  return (_PIECE in name and not name.startswith('Func/') and
          '/input/' not in name)


def Summarize(name: str, ops: Sequence[Op], starts: Sequence[float]
              ) -> WorkerProfile:
  """A worker's complete steps (a call of the step's function whose next
  call the profile holds too): each from its first op's start to its last
  op's end."""
  steps, busy, lags, threads = [], [], [], set()
  for a, b in zip(starts, starts[1:]):
    mine = [o for o in ops if a <= o.start < b]
    if not mine:
      continue
    threads.update(o.thread for o in mine if o.action)
    steps.append(max(o.end for o in mine) - mine[0].start)
    busy.append(trace_lib.UnionLength((o.start, o.end) for o in mine))
    lags.append(SendLags(mine))
  return WorkerProfile(name, steps, busy, lags, len(threads))


def Report(profiles: Sequence[WorkerProfile], top: int = 5) -> str:
  """Per worker: its steps, busy time, and its sends' lags (median, 90th
  percentile, largest, sum a step), then its `top` longest."""
  lines = []
  for p in profiles:
    if not p.step_ms:
      lines.append(f'{p.name}: no complete step in the profile')
      continue
    flat = sorted((s for step in p.lags for s in step), key=lambda s: s.lag)
    ms = [s.lag for s in flat]
    line = (f'{p.name}: {len(p.step_ms)} steps, step '
            f'{statistics.median(p.step_ms):.1f} ms, ops busy '
            f'{statistics.median(p.busy_ms):.1f} ms on {p.threads} '
            f'thread{"s" if p.threads != 1 else ""}')
    if ms:
      line += (f'; {len(ms) / len(p.step_ms):.0f} sends a step, lag median '
               f'{statistics.median(ms):.1f} ms, p90 '
               f'{ms[math.ceil(0.9 * len(ms)) - 1]:.1f}, max {ms[-1]:.1f}, '
               f'{sum(ms) / len(p.step_ms):.1f} ms a step')
    lines.append(line)
    for s in reversed(flat[-top:] if top else []):
      lines.append(f'  {s.lag:7.1f} ms  {s.action} at {s.at:.1f} ms '
                   f'({s.name})')
  return '\n'.join(lines)
