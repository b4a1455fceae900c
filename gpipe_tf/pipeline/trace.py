"""Records when each pipeline action really started and ended, from inside a real step.

Pass a ``ScheduleTrace`` to ``PipeliningLayer.FProp(..., trace=t)`` or
``ComputeLossAndGradients(..., trace=t)``: the interpreter stamps every
action (F, B, W, BW of a stage on a micro-batch) with a ``tf.timestamp()``
that runs once the step's inputs are ready and one that runs once its
outputs are, and hands them to ``Record``. The stamps only
observe: nothing waits for them, so a trace never adds an ordering the engine
did not pin itself (a stamp may run a little after the moment it marks).
Return ``t.Tensors()`` from the step; ``Timeline.FromValues`` gives per-action
intervals, the measured bubble fraction, an ASCII chart and a Chrome-trace
(Perfetto) JSON with one track per device.

The interpreter records each device's actions in the order it runs them
(its tick order), so ``ScheduleTrace.DeviceOrder(d)`` is device d's order of
work as the engine built it, whatever the (noisy) stamps say.

Build a traced step with ``TracedStep`` (``tf.compat.v1.wrap_function``), NOT
``tf.function``: ``tf.timestamp`` is a stateful op, and tf.function chains all
stateful ops in program order (automatic control dependencies), which would
serialise every action and show a schedule that never overlaps. A side
effect that nothing fetches (a BatchNorm moving-statistics update) does not
run in such a step either.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Iterable

import tensorflow as tf

from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline.schedule import ascii as ascii_lib

__all__ = ['ScheduleTrace', 'Timeline', 'TracedStep', 'UnionLength']


class ScheduleTrace:
  """Collects start/end timestamp tensors per action while the graph is built."""

  def __init__(self, schedule: schedule_lib.Schedule | None = None) -> None:
    self.schedule = schedule
    self.actions: list[schedule_lib.Action] = []
    self._starts: list[tf.Tensor] = []
    self._ends: list[tf.Tensor | None] = []

  def Record(self, action: schedule_lib.Action, start: tf.Tensor,
             end: tf.Tensor) -> None:
    """Records an action's start and end stamps, taken by the interpreter."""
    self.actions.append(action)
    self._starts.append(start)
    self._ends.append(end)

  def Tensors(self) -> tuple[tf.Tensor, tf.Tensor]:
    """(starts, ends) as float64 vectors in the order of ``actions``."""
    return tf.stack(self._starts), tf.stack(self._ends)

  def DeviceOrder(self, device: int) -> list[schedule_lib.Action]:
    """The actions recorded on a device, in the order the interpreter runs
    them there (its ticks; a joined B and W, a fused F and backward, in
    that order)."""
    return [a for a in self.actions
            if self.schedule.DeviceOf(a.stage) == device]


def TracedStep(fn: Callable[[], Any]) -> Callable[[], Any]:
  """Builds `fn` (no arguments) into a graph function without automatic
  control dependencies, so the timestamps do not order the actions."""
  return tf.compat.v1.wrap_function(fn, [])


@dataclasses.dataclass
class Timeline:
  """Measured intervals of every action, in seconds from the first start."""
  schedule: schedule_lib.Schedule
  actions: list
  start: list
  end: list

  @classmethod
  def FromValues(cls, trace: ScheduleTrace, starts, ends) -> 'Timeline':
    t0 = float(min(starts))
    return cls(trace.schedule, list(trace.actions),
               [float(s) - t0 for s in starts], [float(e) - t0 for e in ends])

  @property
  def makespan(self) -> float:
    return max(self.end)

  def _Rows(self):
    for d in range(self.schedule.num_devices):
      yield d, [(a, s, e) for a, s, e in zip(self.actions, self.start,
                                              self.end)
                if self.schedule.DeviceOf(a.stage) == d]

  def DeviceBusy(self) -> list[float]:
    """Each device's busy seconds: the union of its actions' intervals."""
    return [UnionLength((s, e) for _, s, e in row) for _, row in self._Rows()]

  def BubbleFraction(self) -> float:
    """Idle fraction of the devices x makespan area (busy = inside an action)."""
    return 1.0 - sum(self.DeviceBusy()) / (self.schedule.num_devices *
                                           self.makespan)

  def SimulatedBubble(self) -> float:
    """The schedule's bubble with unit-time F, B and W (BW = 2)."""
    return schedule_lib.Simulate(self.schedule).bubble_fraction

  def ToAscii(self, width: int = 100) -> str:
    """One row per device, one character per 1/width of the makespan.

    A forward is drawn as its micro-batch's last digit, a B or BW as a
    lower-case letter (a for micro-batch 0), a W as an upper-case one;
    blank is idle (ascii_lib.Grid lays the rows out).
    """
    scale = width / self.makespan
    rows = []
    for _, row in self._Rows():
      line = [' '] * (width + 1)
      for a, s, e in row:
        lo, hi = int(s * scale), max(int(s * scale) + 1, int(e * scale))
        ch = (str(a.micro_batch % 10) if a.kind == schedule_lib.F else
              chr(ord('a' if a.kind != schedule_lib.W else 'A') +
                  a.micro_batch % 26))
        for i in range(lo, min(hi, width + 1)):
          line[i] = ch
      rows.append(line)
    return ascii_lib.Grid(rows, idle=' ', separator='')

  def ToChromeTrace(self) -> dict:
    """The timeline as Chrome-trace JSON (chrome://tracing, ui.perfetto.dev).

    One track (thread) per device; each action is a complete ('X') event
    named like 'F3' / 'BW3' (stage in its args), times in microseconds.
    """
    events = [{'name': 'thread_name', 'ph': 'M', 'pid': 0, 'tid': d,
               'args': {'name': f'device {d}'}}
              for d in range(self.schedule.num_devices)]
    for d, row in self._Rows():
      for a, s, e in row:
        events.append({'name': f'{a.kind}{a.micro_batch}', 'cat': a.kind,
                       'ph': 'X', 'pid': 0, 'tid': d, 'ts': s * 1e6,
                       'dur': max(e - s, 0.0) * 1e6,
                       'args': {'stage': a.stage,
                                'micro_batch': a.micro_batch}})
    return {'traceEvents': events, 'displayTimeUnit': 'ms',
            'otherData': {'schedule': self.schedule.name}}

  def WriteChromeTrace(self, path: str) -> None:
    with open(path, 'w') as f:
      json.dump(self.ToChromeTrace(), f)


def UnionLength(intervals: Iterable[tuple[float, float]]) -> float:
  """The length of the union of (start, end) intervals (overlaps counted
  once, an interval that ends before it starts as empty)."""
  total, reach = 0.0, None
  for start, end in sorted(intervals):
    if reach is not None:
      start = max(start, reach)
    total += max(end - start, 0.0)
    reach = end if reach is None else max(reach, end)
  return total
