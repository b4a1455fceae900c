"""Where a traced step's devices wait: the idle time before each action, what it waited for and when that ended.

Pure Python over a gpipe_tf.pipeline.trace.Timeline (tools.trace.schedule
--waits=N prints it). The engine stamps every step it runs; an action that
ran joined with another (a BW made of B and W, an FB made of F and its
backward) shares their stamps, so the steps a device ran are the distinct
(start, end) intervals of its actions. For each step after the device's
first, the **wait** is the gap between the end of the device's previous
step and its start, split by its latest data dependency on another
device (schedule.Dependencies):

  * **on data**: the part of the gap before that dependency ended (the
    device had nothing it could run: a schedule bubble, or the other
    device running late);
  * **after data**: the rest, from the later of the dependency's end and
    the previous step's end to the start: the message's transfer, and
    anything else the device did or waited for that no stamp covers.

What it does NOT do: see inside a step (a profiler does), or tell a late
stamp from a late action (a stamp runs once its inputs are ready, and may
run a little after).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from gpipe_tf.pipeline import schedule as schedule_lib

__all__ = ['Wait', 'DeviceWaits', 'Waits', 'WaitReport']


@dataclasses.dataclass(frozen=True)
class Wait:
  """The gap before one step of a device.

  Attributes:
    actions: the schedule's actions the step ran (joined ones together).
    start: when the step started (seconds from the step's first stamp).
    on_data: seconds of the gap before its latest remote dependency ended.
    after_data: the rest of the gap.
    waited_for: that dependency (None when it has none on another device,
      or it ended before the device was free).
  """
  actions: tuple[schedule_lib.Action, ...]
  start: float
  on_data: float
  after_data: float
  waited_for: schedule_lib.Action | None

  @property
  def seconds(self) -> float:
    return self.on_data + self.after_data


@dataclasses.dataclass(frozen=True)
class DeviceWaits:
  """A device's steps and gaps over one traced step.

  Attributes:
    busy: seconds inside its steps.
    first_start: when its first step started.
    tail: from the end of its last step to the end of the whole step.
    waits: the gap before each of its steps after the first, in order.
  """
  busy: float
  first_start: float
  tail: float
  waits: tuple[Wait, ...]

  @property
  def on_data(self) -> float:
    return sum(w.on_data for w in self.waits)

  @property
  def after_data(self) -> float:
    return sum(w.after_data for w in self.waits)


def Waits(timeline) -> list[DeviceWaits]:
  """Each device's DeviceWaits (module docstring) from a trace Timeline."""
  sched = timeline.schedule
  end_of = {a: e for a, e in zip(timeline.actions, timeline.end)}
  device_of = {a: sched.DeviceOf(a.stage) for a in timeline.actions}
  out = []
  for d in range(sched.num_devices):
    steps: dict[tuple[float, float], list] = {}
    for a, s, e in zip(timeline.actions, timeline.start, timeline.end):
      if device_of[a] == d:
        steps.setdefault((s, e), []).append(a)
    order = sorted(steps)
    waits, busy, free = [], 0.0, None
    for (s, e) in order:
      acts = tuple(steps[(s, e)])
      busy += e - s
      if free is not None:
        remote = [dep for a in acts for dep in sched.Dependencies(a)
                  if dep in end_of and device_of[dep] != d]
        dep = max(remote, key=end_of.get, default=None)
        gap = max(s - free, 0.0)
        if dep is not None and end_of[dep] > free:
          on_data = min(end_of[dep] - free, gap)
        else:
          on_data, dep = 0.0, None
        waits.append(Wait(acts, s, on_data, gap - on_data, dep))
      free = e if free is None else max(free, e)
    out.append(DeviceWaits(busy, order[0][0] if order else 0.0,
                           timeline.makespan - (free or 0.0), tuple(waits)))
  return out


def _Label(actions: Sequence[schedule_lib.Action]) -> str:
  return '+'.join(a.stage_label for a in actions)


def WaitReport(timeline, top: int = 5) -> str:
  """Per device: busy, the waits on data and after data, the head (before
  its first step) and tail, and its ``top`` longest waits (ms)."""
  lines = []
  for d, dw in enumerate(Waits(timeline)):
    lines.append(
        f'device {d}: busy {1e3 * dw.busy:.1f} ms of '
        f'{1e3 * timeline.makespan:.1f}; waited {1e3 * dw.on_data:.1f} ms '
        f'on data from the other devices and {1e3 * dw.after_data:.1f} ms '
        f'after it; head {1e3 * dw.first_start:.1f} ms, tail '
        f'{1e3 * dw.tail:.1f} ms')
    for w in sorted(dw.waits, key=lambda w: -w.seconds)[:top]:
      what = ('' if w.waited_for is None else
              f' for {w.waited_for.stage_label}')
      lines.append(f'  {_Label(w.actions)} at {1e3 * w.start:.1f} ms: waited '
                   f'{1e3 * w.seconds:.1f} ms ({1e3 * w.on_data:.1f} on '
                   f'data{what}, {1e3 * w.after_data:.1f} after)')
  return '\n'.join(lines)
