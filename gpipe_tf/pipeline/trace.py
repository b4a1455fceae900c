"""Records when each pipeline task really started and ended, from inside a real step.

Pass a ``ScheduleTrace`` to ``PipeliningLayer.FProp(..., trace=t)``: every
forward task F(k, m) and, once the gradient is taken, every backward task
B(k, m) gets a ``tf.timestamp()`` that runs just before the task's first op
(its inputs wait for it) and one that runs after its last output (its
consumers wait for it). Return ``t.Tensors()`` from the step, then
``Timeline.FromValues`` gives per-task intervals, the measured bubble fraction
and an ASCII chart.

Build a traced step with ``TracedStep`` (``tf.compat.v1.wrap_function``), NOT
``tf.function``: ``tf.timestamp`` is a stateful op, and tf.function chains all
stateful ops in program order (automatic control dependencies), which would
serialise every task and show a schedule that never overlaps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import tensorflow as tf

from gpipe_tf.pipeline import schedule as schedule_lib


class ScheduleTrace:
  """Collects start/end timestamp tensors per task while the graph is built."""

  def __init__(self, schedule: schedule_lib.Schedule | None = None) -> None:
    self.schedule = schedule
    self.tasks: list[schedule_lib.Task] = []
    self._starts: list[tf.Tensor] = []
    self._ends: list[tf.Tensor] = []

  def Start(self, task: schedule_lib.Task, inputs: Sequence[Any]) -> list:
    """Stamps the start of `task`; returns `inputs` made to wait for the stamp.

    The stamp also waits for the end stamps of the task's dependencies in the
    schedule, so a dependency's end is never stamped after this start.
    """
    ready = [t for t in inputs if t is not None]
    if self.schedule is not None:
      for dep in self.schedule.dependencies(task):
        if dep in self.tasks:
          end = self._ends[self.tasks.index(dep)]
          if end is not None:
            ready.append(end)
    with tf.control_dependencies(ready):
      stamp = tf.timestamp()
    self.tasks.append(task)
    self._starts.append(stamp)
    self._ends.append(None)
    with tf.control_dependencies([stamp]):
      return [None if t is None else tf.identity(t) for t in inputs]

  def End(self, task: schedule_lib.Task, outputs: Sequence[Any]) -> list:
    """Stamps the end of `task`; returns `outputs` made to wait for the stamp."""
    done = [t for t in outputs if t is not None]
    with tf.control_dependencies(done):
      stamp = tf.timestamp()
    self._ends[self.tasks.index(task)] = stamp
    with tf.control_dependencies([stamp]):
      return [None if t is None else tf.identity(t) for t in outputs]

  def Tensors(self) -> tuple[tf.Tensor, tf.Tensor]:
    """(starts, ends) as float64 vectors in the order of ``tasks``."""
    return tf.stack(self._starts), tf.stack(self._ends)


def TracedStep(fn: Callable[[], Any]) -> Callable[[], Any]:
  """Builds `fn` (no arguments) into a graph function without automatic
  control dependencies, so the timestamps do not order the tasks."""
  return tf.compat.v1.wrap_function(fn, [])


@dataclasses.dataclass
class Timeline:
  """Measured intervals of every task, in seconds from the first start."""
  tasks: list
  start: list
  end: list
  num_cells: int
  num_micro_batches: int

  @classmethod
  def FromValues(cls, trace: ScheduleTrace, starts, ends) -> 'Timeline':
    t0 = float(min(starts))
    tasks = list(trace.tasks)
    return cls(tasks, [float(s) - t0 for s in starts],
               [float(e) - t0 for e in ends],
               1 + max(t.cell for t in tasks),
               1 + max(t.micro_batch for t in tasks))

  @property
  def makespan(self) -> float:
    return max(self.end)

  def BubbleFraction(self) -> float:
    """Idle fraction of the cells x makespan area (busy = inside some task)."""
    busy = 0.0
    for k in range(self.num_cells):
      spans = sorted((s, e) for t, s, e in zip(self.tasks, self.start,
                                                self.end) if t.cell == k)
      cur_s, cur_e = None, None
      for s, e in spans:  # Union of intervals, in case tasks overlap.
        if cur_e is None or s > cur_e:
          busy += 0.0 if cur_e is None else cur_e - cur_s
          cur_s, cur_e = s, e
        else:
          cur_e = max(cur_e, e)
      if cur_e is not None:
        busy += cur_e - cur_s
    return 1.0 - busy / (self.num_cells * self.makespan)

  def TheoreticalBubble(self) -> float:
    k, m = self.num_cells, self.num_micro_batches
    return (k - 1) / (m + k - 1)

  def ToAscii(self, width: int = 100) -> str:
    scale = width / self.makespan
    rows = []
    for k in range(self.num_cells):
      line = [' '] * (width + 1)
      for t, s, e in zip(self.tasks, self.start, self.end):
        if t.cell != k:
          continue
        a, b = int(s * scale), max(int(s * scale) + 1, int(e * scale))
        ch = str(t.micro_batch % 10) if t.kind == 'F' else chr(
            ord('a') + t.micro_batch % 26)
        for i in range(a, min(b, width + 1)):
          line[i] = ch
      rows.append(f'cell {k} |' + ''.join(line))
    return '\n'.join(rows)
