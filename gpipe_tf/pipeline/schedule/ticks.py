"""Lowers a schedule to a tick program: what every device runs at every tick of the interpreter's loop.

The interpreter (pipeline/interpreter.py) runs every device once per tick,
and what a device reads from another is what that device had made by the
end of the previous tick. So each action gets the earliest tick after the
action before it on its device and after every action whose output it reads
(Schedule.Dependencies), every action taking one tick. A device runs at most
one action per tick, in its list's order: the schedule's order is kept
exactly, W actions included (a W runs the weight-gradient half of its B,
later, where the schedule put it).

Each action is lowered to a *step*: its kind and stage, and whether the
forward keeps its activations for its backward (``keep``) or the backward
recomputes them from the stage's input. A device's distinct steps are its
branches (branch 0 idles), so the loop body holds one piece of code per step,
whatever M is. 1F1B with K = 2, M = 3, the last stage fused
(``ToAscii()``)::

    dev 0: F0  F1  BW0 F2  BW1 BW2
    dev 1: ..  FB0 FB1 ..  FB2 ..

A *fused* pair (s, m) runs F(s, m), the loss and its backward as one step
(FB) in F's tick, keeping the activations in between: only the last stage's
pairs whose backward directly follows their F on the device (Fusable) can
be fused, since that backward reads nothing but the loss of its own forward.

A *joined* pair (s, m) runs B(s, m) and W(s, m) as one BW step in B's tick,
where W directly follows its B on the device (Joinable): the order is the
schedule's, and the backward computes each layer's input and weight
gradients together instead of stashing what W reads until the next tick.
ZB-H1's first stage, whose W all follow their B at once, then runs as
1F1B's; a W the schedule defers still runs where it put it.

A *phase* lowers part of a schedule: 'forward' its F actions (inference, or
the forward of a tape-driven fill-drain step), 'backward' the rest (their F
having run in an earlier loop), 'all' everything (the loss inside).

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import table

__all__ = ['FB', 'PHASES', 'Fusable', 'Joinable', 'Lower', 'SplitStages',
           'Step', 'TickProgram']

Action = action_lib.Action
F, B, W, BW = action_lib.F, action_lib.B, action_lib.W, action_lib.BW
FB = 'FB'  # A fused F, loss and backward of the last stage.
PHASES = ('all', 'forward', 'backward')


@dataclasses.dataclass(frozen=True)
class Step:
  """One branch of a device's loop body.

  Attributes:
    kind: F, B, W, BW or FB (fused F + loss + backward).
    stage: the stage it runs.
    keep: F: saves the activations its backward reads; B/BW: reads them
      (else recomputes the forward from the stage's input). False for W,
      True for FB (its activations never leave the step).
    split: FB: its backward is a B (a W follows), else a BW.
  """
  kind: str
  stage: int
  keep: bool = False
  split: bool = False


@dataclasses.dataclass(frozen=True)
class TickProgram:
  """A schedule lowered to ticks.

  Attributes:
    num_ticks: the loop's iterations.
    tick: the tick of every action of the phase (a fused pair's backward
      has its F's tick).
    grid: grid[d][t] is device d's action at tick t, None when it idles (a
      fused pair shows as its F, a joined pair as its B).
    fused: the (stage, micro-batch) pairs run as one FB step.
    joined: the (stage, micro-batch) pairs whose B and W run as one BW step
      (W has its B's tick).
    steps: steps[d] lists device d's distinct steps; branch j + 1 runs
      steps[d][j].
    branch: branch[d][t], 0 when device d idles at tick t.
    micro: micro[d][t], the micro-batch of that step (0 when idle).
    got_y: got_y[s][t], the micro-batch whose output stage s-1 made at tick
      t-1 and stage s takes in at tick t; -1 for none.
    got_dx: got_dx[s][t], the micro-batch whose input gradient stage s+1
      made at tick t-1 and stage s takes in at tick t; -1 for none.
  """
  num_ticks: int
  tick: dict[Action, int]
  grid: tuple[tuple[Action | None, ...], ...]
  fused: frozenset[tuple[int, int]]
  joined: frozenset[tuple[int, int]]
  steps: tuple[tuple[Step, ...], ...]
  branch: tuple[tuple[int, ...], ...]
  micro: tuple[tuple[int, ...], ...]
  got_y: tuple[tuple[int, ...], ...]
  got_dx: tuple[tuple[int, ...], ...]

  def Runs(self, act: Action) -> list[Action]:
    """The actions grid entry `act` runs in its tick: itself, a fused
    pair's backward after its F, a joined pair's W after its B."""
    pair = (act.stage, act.micro_batch)
    runs = [act]
    if act.kind == F and pair in self.fused:
      runs += [a for a in (Action(B, *pair), Action(BW, *pair))
               if a in self.tick]
    if runs[-1].kind == B and pair in self.joined:
      runs.append(Action(W, *pair))
    return runs

  def ToAscii(self) -> str:
    """One row per device, one column per tick: 'F3', 'B3', 'W3', 'BW3'
    (a BW, or a joined B and W), 'FB3' (fused), '..' idle."""
    rows = []
    for d, row in enumerate(self.grid):
      cells = []
      for act in row:
        if act is None:
          cells.append('..')
        elif act.kind == F and (act.stage, act.micro_batch) in self.fused:
          cells.append(f'FB{act.micro_batch}')
        elif act.kind == B and (act.stage, act.micro_batch) in self.joined:
          cells.append(f'BW{act.micro_batch}')
        else:
          cells.append(act.label)
      width = max(len(c) for c in cells)
      rows.append(f'dev {d}: ' + ' '.join(c.ljust(width) for c in cells))
    return '\n'.join(rows)


def Fusable(schedule: table.Schedule) -> frozenset[tuple[int, int]]:
  """The pairs Lower can fuse: the last stage's (s, m) whose backward
  directly follows F(s, m) on its device."""
  last = schedule.num_stages - 1
  return frozenset((s, m) for s, m in schedule.ForwardsFollowedByBackward()
                   if s == last)


def Joinable(schedule: table.Schedule) -> frozenset[tuple[int, int]]:
  """The pairs Lower can join: (s, m) whose W directly follows B(s, m) on
  its device."""
  pairs = set()
  for acts in schedule.actions:
    for b, w in zip(acts, acts[1:]):
      if (b.kind == B and w.kind == W and
          (b.stage, b.micro_batch) == (w.stage, w.micro_batch)):
        pairs.add((b.stage, b.micro_batch))
  return frozenset(pairs)


def SplitStages(program: 'TickProgram') -> frozenset[int]:
  """The stages some step of `program` runs as B then a later W."""
  return frozenset(step.stage for row in program.steps for step in row
                   if step.kind in (B, W) or (step.kind == FB and step.split))


def _InPhase(act: Action, phase: str) -> bool:
  if phase == 'forward':
    return act.kind == F
  if phase == 'backward':
    return act.kind != F
  return True


def _Ticks(schedule: table.Schedule, phase: str,
           fused: frozenset[tuple[int, int]],
           joined: frozenset[tuple[int, int]]) -> dict[Action, int]:
  tick: dict[Action, int] = {}
  last = [-1] * schedule.num_devices
  for act in schedule.Order():
    if not _InPhase(act, phase):
      continue
    pair = (act.stage, act.micro_batch)
    if act.kind in (B, BW) and pair in fused:
      tick[act] = tick[Action(F, *pair)]
      continue
    if act.kind == W and pair in joined:
      tick[act] = tick[Action(B, *pair)]
      continue
    d = schedule.DeviceOf(act.stage)
    t = last[d] + 1
    for dep in schedule.Dependencies(act):
      if dep in tick:  # Not in tick: run in an earlier phase.
        t = max(t, tick[dep] + 1)
    tick[act] = t
    last[d] = t
  return tick


def Lower(schedule: table.Schedule, *, phase: str = 'all',
          fused: frozenset[tuple[int, int]] = frozenset(),
          joined: frozenset[tuple[int, int]] = frozenset(),
          keep: Callable[[int, int], bool] = lambda s, m: True
          ) -> TickProgram:
  """Lowers (a phase of) a validated schedule to its tick program.

  Args:
    schedule: the schedule (validated here).
    phase: 'all', 'forward' or 'backward' (module docstring).
    fused: (stage, micro-batch) pairs to run as one FB step; a subset of
      Fusable(schedule), and only with phase 'all'.
    joined: (stage, micro-batch) pairs whose B and W run as one BW step; a
      subset of Joinable(schedule).
    keep: keep(s, m) is True when F(s, m) keeps its activations for its
      backward, False when the backward recomputes them.

  Raises:
    ScheduleError: the schedule is not valid (Schedule.Validate), the phase
      is unknown, or a fused pair is not fusable or a joined one joinable.
  """
  schedule.Validate()
  if phase not in PHASES:
    raise table.ScheduleError(f'phase must be one of {PHASES}, got {phase!r}')
  fused = frozenset(fused)
  if fused and phase != 'all':
    raise table.ScheduleError(
        f"fused pairs need phase 'all' (the loss inside), not {phase!r}")
  if not fused <= Fusable(schedule):
    raise table.ScheduleError(
        f'cannot fuse {sorted(fused - Fusable(schedule))}: only the last '
        "stage's pairs whose backward directly follows their F on the device "
        f'can run as one action ({sorted(Fusable(schedule))} here).')
  joined = frozenset(joined)
  if not joined <= Joinable(schedule):
    raise table.ScheduleError(
        f'cannot join {sorted(joined - Joinable(schedule))}: only a B '
        'directly followed by its W on the device can run with it as one '
        f'action ({sorted(Joinable(schedule))} here).')
  tick = _Ticks(schedule, phase, fused, joined)
  num_ticks = 1 + max(tick.values(), default=-1)
  k, num_stages = schedule.num_devices, schedule.num_stages
  grid = [[None] * num_ticks for _ in range(k)]
  steps: list[list[Step]] = [[] for _ in range(k)]
  branch = [[0] * num_ticks for _ in range(k)]
  micro = [[0] * num_ticks for _ in range(k)]
  got_y = [[-1] * num_ticks for _ in range(num_stages)]
  got_dx = [[-1] * num_ticks for _ in range(num_stages)]
  for act, t in tick.items():
    s, m = act.stage, act.micro_batch
    d = schedule.DeviceOf(s)
    if t + 1 < num_ticks:
      if act.kind == F and s + 1 < num_stages:
        got_y[s + 1][t + 1] = m
      elif act.kind in (B, BW) and s > 0:
        got_dx[s - 1][t + 1] = m
    if act.kind in (B, BW) and (s, m) in fused:
      continue  # Runs inside its F's step.
    if act.kind == W and (s, m) in joined:
      continue  # Runs inside its B's step.
    if act.kind == F and (s, m) in fused:
      step = Step(FB, s, True, schedule.SplitBackward(s, m) and
                  (s, m) not in joined)
    elif act.kind == W:
      step = Step(W, s)
    elif act.kind == B and (s, m) in joined:
      step = Step(BW, s, bool(keep(s, m)))
    else:
      step = Step(act.kind, s, bool(keep(s, m)))
    if step not in steps[d]:
      steps[d].append(step)
    grid[d][t] = act
    branch[d][t] = 1 + steps[d].index(step)
    micro[d][t] = m
  return TickProgram(
      num_ticks, tick, tuple(tuple(r) for r in grid), fused, joined,
      tuple(tuple(r) for r in steps), tuple(tuple(r) for r in branch),
      tuple(tuple(r) for r in micro), tuple(tuple(r) for r in got_y),
      tuple(tuple(r) for r in got_dx))
