"""Clock ticks for running a schedule as one loop (pipeline/schedule_loop.py).

A loop runs every device once per iteration (a tick), and what a device reads
from another is what that device had made by the end of the previous tick. So
each action gets a tick after the action before it on its device and after
every action whose output it reads (Schedule.Dependencies), the earliest such
tick, every action taking one tick. A device runs at most one action per tick,
in its list's order, and a schedule's order is kept exactly.

W actions get no tick: the loop's backward computes the input and weight
gradients in one pass (as ``trace_once`` does), so a B is run as a BW and its
W has nothing left to do.

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

import dataclasses

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import table

Action = action_lib.Action


@dataclasses.dataclass(frozen=True)
class TickTable:
  """When each action runs in a loop over ticks.

  Attributes:
    num_ticks: the loop's iterations.
    tick: the tick of every action but W.
    grid: grid[d][t] is device d's action at tick t, None when it idles.
  """
  num_ticks: int
  tick: dict[Action, int]
  grid: tuple[tuple[Action | None, ...], ...]

  def Branches(self, stages: list[list[int]]) -> tuple[list, list]:
    """(branch, micro): per device d and tick t, which pass to run and on
    which micro-batch. branch[d][t] is 0 when d idles, 1 + 2j for F and
    2 + 2j for the backward of stages[d][j] (B and BW alike); micro[d][t]
    is its micro-batch (0 when idle)."""
    branch = [[0] * self.num_ticks for _ in stages]
    micro = [[0] * self.num_ticks for _ in stages]
    for d, row in enumerate(self.grid):
      for t, act in enumerate(row):
        if act is not None:
          j = stages[d].index(act.stage)
          branch[d][t] = 1 + 2 * j + (act.kind != action_lib.F)
          micro[d][t] = act.micro_batch
    return branch, micro

  def Receipts(self, num_stages: int) -> tuple[list, list]:
    """(forward, backward): forward[s][t] is the micro-batch whose output
    stage s-1 made at tick t-1, which stage s takes in at tick t, and
    backward[s][t] the one whose input gradient stage s+1 made at tick t-1;
    -1 where there is none."""
    forward = [[-1] * self.num_ticks for _ in range(num_stages)]
    backward = [[-1] * self.num_ticks for _ in range(num_stages)]
    for act, t in self.tick.items():
      if t + 1 >= self.num_ticks:
        continue
      if act.kind == action_lib.F and act.stage + 1 < num_stages:
        forward[act.stage + 1][t + 1] = act.micro_batch
      elif act.kind != action_lib.F and act.stage > 0:
        backward[act.stage - 1][t + 1] = act.micro_batch
    return forward, backward


def Ticks(schedule: table.Schedule) -> TickTable:
  """The tick table of a schedule (validated first).

  Raises:
    ScheduleError: if the schedule is not valid (Schedule.Validate).
  """
  schedule.Validate()
  tick: dict[Action, int] = {}
  last = [-1] * schedule.num_devices
  for act in schedule.Order():
    if act.kind == action_lib.W:
      continue
    d = schedule.DeviceOf(act.stage)
    t = last[d] + 1
    for dep in schedule.Dependencies(act):
      t = max(t, tick[dep] + 1)
    tick[act] = t
    last[d] = t
  num_ticks = 1 + max(tick.values())
  grid = [[None] * num_ticks for _ in range(schedule.num_devices)]
  for act, t in tick.items():
    grid[schedule.DeviceOf(act.stage)][t] = act
  return TickTable(num_ticks, tick, tuple(tuple(row) for row in grid))
