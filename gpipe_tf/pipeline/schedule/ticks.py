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

A *fused* pair (s, m) runs F(s, m) and its backward as one action in F's
tick: the loop computes the loss and differentiates right after the forward,
keeping its activations instead of recomputing them. Only the last stage's
pairs whose backward directly follows their F on the device can be fused
(every micro-batch of 1F1B's last stage): the backward then reads nothing
but the loss of its own forward.

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
    tick: the tick of every action but W (a fused pair's backward has its
      F's tick).
    grid: grid[d][t] is device d's action at tick t, None when it idles (a
      fused pair shows as its F).
    fused: the (stage, micro-batch) pairs whose F and backward are one
      action.
  """
  num_ticks: int
  tick: dict[Action, int]
  grid: tuple[tuple[Action | None, ...], ...]
  fused: frozenset[tuple[int, int]] = frozenset()

  def Branches(self, stages: list[list[int]]) -> tuple[list, list]:
    """(branch, micro): per device d and tick t, which pass to run and on
    which micro-batch. branch[d][t] is 0 when d idles, 1 + 2j for F and
    2 + 2j for the backward of stages[d][j] (B and BW alike), and
    1 + 2 len(stages[d]) for a fused F and backward (of the last stage, the
    only one that can be fused); micro[d][t] is its micro-batch (0 when
    idle)."""
    branch = [[0] * self.num_ticks for _ in stages]
    micro = [[0] * self.num_ticks for _ in stages]
    for d, row in enumerate(self.grid):
      for t, act in enumerate(row):
        if act is not None:
          j = stages[d].index(act.stage)
          if (act.stage, act.micro_batch) in self.fused:
            branch[d][t] = 1 + 2 * len(stages[d])
          else:
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


def Fusable(schedule: table.Schedule) -> frozenset[tuple[int, int]]:
  """The pairs Ticks can fuse: the last stage's (s, m) whose backward
  directly follows F(s, m) on its device."""
  last = schedule.num_stages - 1
  return frozenset((s, m) for s, m in schedule.ForwardsFollowedByBackward()
                   if s == last)


def Ticks(schedule: table.Schedule,
          fused: frozenset[tuple[int, int]] = frozenset()) -> TickTable:
  """The tick table of a schedule (validated first).

  Args:
    schedule: the schedule.
    fused: (stage, micro-batch) pairs whose F and backward run as one action
      in F's tick; a subset of Fusable(schedule).

  Raises:
    ScheduleError: if the schedule is not valid (Schedule.Validate), or a
      fused pair is not fusable.
  """
  schedule.Validate()
  fused = frozenset(fused)
  if not fused <= Fusable(schedule):
    raise table.ScheduleError(
        f'cannot fuse {sorted(fused - Fusable(schedule))}: only the last '
        "stage's pairs whose backward directly follows their F on the device "
        f'can run as one action ({sorted(Fusable(schedule))} here).')
  tick: dict[Action, int] = {}
  last = [-1] * schedule.num_devices
  for act in schedule.Order():
    if act.kind == action_lib.W:
      continue
    d = schedule.DeviceOf(act.stage)
    if (act.kind != action_lib.F and
        (act.stage, act.micro_batch) in fused):
      tick[act] = tick[action_lib.Action(action_lib.F, act.stage,
                                         act.micro_batch)]
      continue
    t = last[d] + 1
    for dep in schedule.Dependencies(act):
      t = max(t, tick[dep] + 1)
    tick[act] = t
    last[d] = t
  num_ticks = 1 + max(tick.values())
  grid = [[None] * num_ticks for _ in range(schedule.num_devices)]
  for act, t in tick.items():
    if act.kind == action_lib.F or (act.stage, act.micro_batch) not in fused:
      grid[schedule.DeviceOf(act.stage)][t] = act
  return TickTable(num_ticks, tick, tuple(tuple(row) for row in grid),
                   fused)
