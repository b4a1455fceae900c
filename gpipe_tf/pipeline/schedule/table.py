"""Schedule: the ordered action list of every device, its dependencies, checks and grid.

A schedule is data: actions[d] lists, in order, the passes device d runs
during one training step. Stage s lives on device stage_devices[s]; by default
s % K, so with S = V * K stages every device holds V stages in Megatron's
interleaved ("looping") placement, e.g. K = 2, S = 4:

    device 0: stages 0, 2        stage 0 -> 1 -> 2 -> 3
    device 1: stages 1, 3        device 0 -> 1 -> 0 -> 1

Time is not part of the data. Clocks() derives the unit-time grid by letting
every device run its list as early as data dependencies allow, with F, B and W
one tick each and BW two ticks (it is a B and a W in one pass). The 1F1B
schedule of K = 3 devices and M = 4 micro-batches draws (ToAscii()) as

    dev 0: F0  F1  F2  ..  ..  ..  ..  BW0 BW0 F3  BW1 BW1 ..  BW2 BW2 ..  BW3 BW3
    dev 1: ..  F0  F1  ..  ..  BW0 BW0 F2  BW1 BW1 F3  BW2 BW2 ..  BW3 BW3 ..  ..
    dev 2: ..  ..  F0  BW0 BW0 F1  BW1 BW1 F2  BW2 BW2 F3  BW3 BW3 ..  ..  ..  ..

A cell is labelled 'F3' when each device holds one stage, 'F3s1' (micro-batch
3, stage 1) when some device holds several.

This module deliberately does not build ops or pick a schedule; library.py
builds the named ones and the engine runs whatever Order() returns.
"""

from collections.abc import Sequence

from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import replay as replay_lib

__all__ = ['Schedule', 'UNIT_TICKS']

Action = action_lib.Action
ScheduleError = action_lib.ScheduleError
F, B, W, BW = action_lib.F, action_lib.B, action_lib.W, action_lib.BW
FB = action_lib.FB

# FB takes its F's tick and its backward's: 2 when a W follows it, else 3.
UNIT_TICKS = {F: 1, B: 1, W: 1, BW: 2, FB: 3}
# The kinds one (stage, micro-batch) cannot have beside each kind: a pair
# runs one F (or FB) and one backward (BW, B and W, or FB's and a W).
_RIVALS = {F: (FB,), BW: (B, W, FB), B: (BW, FB), W: (BW,), FB: (F, B, BW)}


class Schedule:
  """The ordered actions of every device for one step, and what they wait for.

  Immutable. Library schedules come from library.Make(), which validates them;
  a hand-built one should be checked with Validate() before it is run.
  """

  def __init__(self, actions: Sequence[Sequence[Action]], num_micro_batches: int,
               stage_devices: Sequence[int] | None = None, name: str = 'custom'):
    """Creates a schedule (without validating it; see Validate()).

    Args:
      actions: actions[d] is device d's ordered action list; K = len(actions).
      num_micro_batches: M >= 1.
      stage_devices: stage_devices[s] is the device of stage s; its length is
        the number of stages S. Default: S = 1 + the largest stage in actions,
        stage s on device s % K.
      name: shown in messages and repr.

    Raises:
      ScheduleError: if actions is empty or holds a non-Action, M is not an
        int >= 1, or stage_devices names a device outside [0, K).
    """
    action_lib.CheckIndex(num_micro_batches, 'num_micro_batches', minimum=1)
    if isinstance(actions, str) or not actions:
      raise ScheduleError('actions must hold one action list per device, got '
                          f'{actions!r}')
    rows = tuple(tuple(acts) for acts in actions)
    for d, acts in enumerate(rows):
      for i, act in enumerate(acts):
        if not isinstance(act, Action):
          raise ScheduleError(f'actions[{d}][{i}] is {act!r}, not an Action', d, i)
    num_devices = len(rows)
    if stage_devices is None:
      stages = [act.stage for acts in rows for act in acts]
      if not stages:
        raise ScheduleError('the schedule has no actions; give every device its '
                            'F and BW (or B and W) passes')
      stage_devices = [s % num_devices for s in range(1 + max(stages))]
    stage_devices = tuple(stage_devices)
    if not stage_devices:
      raise ScheduleError('stage_devices must place at least one stage')
    for s, device in enumerate(stage_devices):
      action_lib.CheckIndex(device, f'stage_devices[{s}]')
      if device >= num_devices:
        raise ScheduleError(f'stage_devices[{s}] = {device} but the schedule has '
                            f'only {num_devices} devices')
    self._actions = rows
    self._num_micro_batches = int(num_micro_batches)
    self._stage_devices = stage_devices
    self._name = str(name)
    self._present = frozenset(act for acts in rows for act in acts)
    self._unit = None  # The unit-time Replayed, once computed.
    self._valid = False

  @property
  def actions(self) -> tuple[tuple[Action, ...], ...]:
    """actions[d]: device d's ordered actions."""
    return self._actions

  @property
  def num_devices(self) -> int:
    """K, the number of devices (action lists)."""
    return len(self._actions)

  @property
  def num_stages(self) -> int:
    """S, the number of pipeline stages."""
    return len(self._stage_devices)

  @property
  def num_micro_batches(self) -> int:
    """M, the number of micro-batches per step."""
    return self._num_micro_batches

  @property
  def num_virtual_stages(self) -> int:
    """The most stages any one device holds: V for library schedules (S = V * K)."""
    return max(len(self.StagesOn(d)) for d in range(self.num_devices))

  @property
  def stage_devices(self) -> tuple[int, ...]:
    """stage_devices[s]: the device that runs stage s."""
    return self._stage_devices

  @property
  def name(self) -> str:
    """The library name ('gpipe', '1f1b', ...) or 'custom'."""
    return self._name

  def DeviceOf(self, stage: int) -> int:
    """Returns the device of a stage; raises ScheduleError if out of range."""
    if not 0 <= stage < self.num_stages:
      raise ScheduleError(f'stage must be in [0, {self.num_stages}), got {stage}')
    return self._stage_devices[stage]

  def StagesOn(self, device: int) -> list[int]:
    """Returns the stages a device runs, in increasing order."""
    if not 0 <= device < self.num_devices:
      raise ScheduleError(f'device must be in [0, {self.num_devices}), got {device}')
    return [s for s, d in enumerate(self._stage_devices) if d == device]

  def DefersW(self, stage: int, micro_batch: int) -> bool:
    """True when the backward of (stage, micro_batch) runs as B (or FB's)
    and its W later, False for BW (or an FB without a W)."""
    return (Action(B, stage, micro_batch) in self._present or
            (Action(FB, stage, micro_batch) in self._present and
             Action(W, stage, micro_batch) in self._present))

  def _Made(self, act: Action) -> Action:
    """The action of this schedule that makes `act`'s output: FB(s, m)
    for the F and the backward it holds, else `act`."""
    fused = Action(FB, act.stage, act.micro_batch)
    return fused if act.kind != W and fused in self._present else act

  def ForwardsFollowedByBackward(self) -> frozenset[tuple[int, int]]:
    """Returns the (stage, micro_batch) pairs whose backward directly follows their F.

    (s, m) is in the set when the action right after F(s, m) in its device's
    list is B(s, m) or BW(s, m), or FB(s, m) runs both. Nothing else runs on
    that device in between,
    so rematerialising F(s, m) would drop its activations only to rebuild the
    same ones at once: keeping them costs no peak memory on the device. E.g.
    every micro-batch of 1F1B's last stage, and for 'gpipe' (M - 1) on the
    last stage of every device (with V = 1, every stage).

    Pure list inspection: the schedule need not be validated.
    """
    pairs = {(a.stage, a.micro_batch) for acts in self._actions for a in acts
             if a.kind == FB}
    for acts in self._actions:
      for fwd, nxt in zip(acts, acts[1:]):
        if (fwd.kind == F and nxt.kind in (B, BW) and
            (nxt.stage, nxt.micro_batch) == (fwd.stage, fwd.micro_batch)):
          pairs.add((fwd.stage, fwd.micro_batch))
    return frozenset(pairs)

  def Dependencies(self, act: Action) -> list[Action]:
    """Returns the actions whose outputs the given action consumes.

    Data dependencies only; the order within a device is actions[d] itself.
    F(s, m) needs F(s-1, m). B(s, m) and BW(s, m) need F(s, m) and, below the
    last stage, the input gradient of (s+1, m): B(s+1, m) if that backward is
    split, else BW(s+1, m). The loss of micro-batch m is computed right after
    F(S-1, m) on the last stage's device, so B/BW(S-1, m) needs only F(S-1, m).
    W(s, m) needs B(s, m). FB(s, m) needs what its F and its backward need
    from other stages, and any of these read from a pair that runs as FB is
    read from that FB.

    Raises:
      ScheduleError: if the action's stage or micro-batch is out of range.
    """
    s, m = act.stage, act.micro_batch
    if not (0 <= s < self.num_stages and 0 <= m < self.num_micro_batches):
      raise ScheduleError(f'{act} is outside this schedule of {self.num_stages} '
                          f'stages and {self.num_micro_batches} micro-batches')
    if act.kind == W:
      return [self._Made(Action(B, s, m))]
    deps = []
    if act.kind in (F, FB) and s > 0:
      deps.append(Action(F, s - 1, m))
    if act.kind in (B, BW):
      deps.append(Action(F, s, m))
    if act.kind != F and s < self.num_stages - 1:
      deps.append(Action(B if self.DefersW(s + 1, m) else BW, s + 1, m))
    return [self._Made(d) for d in deps]

  def Validate(self) -> None:
    """Checks that the schedule is complete, well placed and runs to the end.

    The checks, in order: every action's stage and micro-batch are in range and
    it sits on the device of its stage; no action appears twice and no
    (stage, micro-batch) mixes BW with B/W (or FB with F, B or BW); replaying
    every device's list in order never gets stuck (a deadlock); every (s, m) has its F and a backward.

    Raises:
      ScheduleError: naming the first bad step (device, position, action and
        what it waits for or what is wrong with it), with the grid of what ran
        up to there and the bad step drawn as '!label'.
    """
    if self._valid:
      return
    problems = self._StaticProblems()
    if problems:
      d = min(problems)
      i, reason = problems[d]
      cut = [acts[:problems[e][0]] if e in problems else acts
             for e, acts in enumerate(self._actions)]
      replayed = replay_lib.Replay(cut, self.Dependencies, self._UnitTicks)
      raise self._Error(d, i, reason, replayed)
    replayed = self._UnitReplay()
    stuck = replayed.Stuck(self._actions)
    if stuck:
      d, reason = self._Deadlock(replayed, stuck)
      raise self._Error(d, replayed.reached[d], reason, replayed)
    self._CheckComplete(replayed)
    self._valid = True

  def Order(self) -> list[Action]:
    """Returns all actions in one order that every device list and dependency obeys.

    Sorted by unit-time start tick (Clocks()), then device.
    """
    self.Validate()
    unit = self._UnitReplay()
    return sorted(unit.start, key=lambda act: (unit.start[act], unit.device[act]))

  def Clocks(self) -> list[list[Action | None]]:
    """Returns the unit-time grid: clocks[t][d] is device d's action at tick t.

    F, B and W take one tick, BW two (so a BW fills two consecutive ticks);
    None means the device is idle.
    """
    self.Validate()
    unit = self._UnitReplay()
    grid = [[None] * self.num_devices for _ in range(int(unit.makespan))]
    for act, start in unit.start.items():
      for t in range(int(start), int(unit.end[act])):
        grid[t][unit.device[act]] = act
    return grid

  def ToAscii(self) -> str:
    """Draws Clocks(): 'dev d: F0 F1 .. BW1 BW1 ...', one column per tick, '..' idle."""
    self.Validate()
    return self._Draw(self._UnitReplay())

  def IsFillDrain(self) -> bool:
    """True when every device runs all its forwards before its first backward."""
    for acts in self._actions:
      kinds = [act.kind == F for act in acts]
      if False in kinds and True in kinds[kinds.index(False):]:
        return False
    return True

  def __repr__(self) -> str:
    return (f'Schedule(name={self._name!r}, num_devices={self.num_devices}, '
            f'num_stages={self.num_stages}, '
            f'num_micro_batches={self.num_micro_batches})')

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Schedule):
      return NotImplemented
    return (self._actions == other.actions and
            self._num_micro_batches == other.num_micro_batches and
            self._stage_devices == other.stage_devices)

  def __hash__(self) -> int:
    return hash((self._actions, self._num_micro_batches, self._stage_devices))

  def _UnitTicks(self, act: Action) -> float:
    if act.kind == FB and self.DefersW(act.stage, act.micro_batch):
      return UNIT_TICKS[F] + UNIT_TICKS[B]
    return UNIT_TICKS[act.kind]

  def _UnitReplay(self) -> replay_lib.Replayed:
    if self._unit is None:
      self._unit = replay_lib.Replay(self._actions, self.Dependencies,
                                     self._UnitTicks)
    return self._unit

  def _StaticProblems(self) -> dict[int, tuple[int, str]]:
    """Per device, the position of its first misplaced, duplicate or mixed action."""
    problems, seen = {}, {}
    for d, acts in enumerate(self._actions):
      for i, act in enumerate(acts):
        reason = self._StaticProblem(d, act, seen)
        if reason:
          problems[d] = (i, reason)
          break
        seen[act] = (d, i)
    return problems

  def _StaticProblem(self, d: int, act: Action, seen: dict) -> str | None:
    s, m = act.stage, act.micro_batch
    if s >= self.num_stages:
      return (f'has stage {s}, out of range: the schedule has {self.num_stages} '
              'stages')
    if m >= self.num_micro_batches:
      return (f'has micro-batch {m}, out of range: the schedule has '
              f'{self.num_micro_batches} micro-batches')
    if self._stage_devices[s] != d:
      return (f'is on the wrong device: stage {s} is placed on device '
              f'{self._stage_devices[s]} (stage_devices[{s}]); move it there')
    if act in seen:
      return 'is a duplicate of device {}, position {}'.format(*seen[act])
    for kind in _RIVALS[act.kind]:
      rival = Action(kind, s, m)
      if rival in seen:
        what = ('mixes BW with B/W' if FB not in (kind, act.kind) else
                'runs beside an FB, which already holds its F and backward,'
                if kind == FB else 'holds an F and backward that run apart')
        return ('{} for its (stage, micro-batch): device {}, position {} has '
                '{}'.format(what, *seen[rival], rival))
    return None

  def _Position(self, act: Action) -> tuple[int, int] | None:
    for d, acts in enumerate(self._actions):
      if act in acts:
        return d, acts.index(act)
    return None

  def _Deadlock(self, replayed: replay_lib.Replayed,
                stuck: list[int]) -> tuple[int, str]:
    """Picks the stuck device to blame and says what its next action waits for.

    A device waiting for an action that no device lists, or that its own list
    runs later, is a bad step by itself and is preferred; otherwise (a cycle
    across devices) the lowest stuck device is named.
    """
    reasons = []
    for d in stuck:
      head = self._actions[d][replayed.reached[d]]
      for dep in self.Dependencies(head):
        if dep in replayed.end:
          continue
        where = self._Position(dep)
        if where is None:
          reasons.append((0, d, f'waits for {dep}, which no device runs'))
        elif where[0] == d:
          reasons.append((0, d, f'waits for {dep}, which runs later on the same '
                                f'device (position {where[1]})'))
        else:
          other = self._actions[where[0]][replayed.reached[where[0]]]
          reasons.append((1, d, f'waits for {dep} (device {where[0]}, position '
                                f'{where[1]}), which never starts: device '
                                f'{where[0]} is itself stuck at position '
                                f'{replayed.reached[where[0]]} on {other}'))
        break
    _, d, reason = min(reasons, key=lambda r: (r[0], r[1]))
    return d, 'deadlocks: it ' + reason

  def _CheckComplete(self, replayed: replay_lib.Replayed) -> None:
    for s in range(self.num_stages):
      for m in range(self.num_micro_batches):
        fwd, back, weight = Action(F, s, m), Action(B, s, m), Action(W, s, m)
        if Action(FB, s, m) in self._present:
          continue  # Its F and backward; a W after it is optional.
        if fwd not in self._present:
          raise ScheduleError(
              f'schedule {self._name!r}: stage {s}, micro-batch {m} has no F; '
              f'device {self._stage_devices[s]} must run {fwd} and its backward\n'
              + self._Draw(replayed), self._stage_devices[s])
        if back in self._present and weight not in self._present:
          raise self._Error(*self._Position(back), f'has no matching {weight}; add '
                            'it after this step', replayed)
        if back not in self._present and Action(BW, s, m) not in self._present:
          raise self._Error(*self._Position(fwd), f'has no backward; add '
                            f'{Action(BW, s, m)} (or B and W) after this step',
                            replayed)

  def _Error(self, d: int, i: int, reason: str,
             replayed: replay_lib.Replayed) -> ScheduleError:
    act = self._actions[d][i]
    grid = self._Draw(replayed, mark=(d, act))
    return ScheduleError(f'schedule {self._name!r}: device {d}, position {i}: '
                         f'{act} {reason}\n{grid}', d, i)

  def _Draw(self, replayed: replay_lib.Replayed,
            mark: tuple[int, Action] | None = None) -> str:
    several = any(len(self.StagesOn(d)) > 1 for d in range(self.num_devices))
    return replayed.Draw(self.num_devices, several, mark)
