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
whatever M is. 1F1B with K = 2, M = 3, after FuseLast (``ToAscii()``)::

    dev 0: F0  F1  BW0 F2  BW1 BW2
    dev 1: ..  FB0 FB1 ..  FB2 ..

Two passes over the schedule come before lowering; each returns a new
schedule that does the same work, in the same order, in fewer actions.

``FuseLast`` replaces the last stage's F(s, m) and the backward that
directly follows it on the device (``Fusable``) by one FB(s, m): F, the loss
and the backward as one step, keeping the activations in between, since
that backward reads nothing but the loss of its own forward.

``JoinBackward`` returns the schedule with
every B(s, m) that its W(s, m) directly follows on the device replaced by
one BW(s, m), so the backward computes each layer's input and weight
gradients together instead of stashing what W reads until the next tick.
ZB-H1's first stage, whose W all follow their B at once, then runs as
1F1B's; a W the schedule defers still runs where it put it. Which stages
defer W (run their backward as B and a later W) is then read off the
schedule the engine lowers (StagesDeferringW), once.

A *phase* lowers part of a schedule: 'forward' its F actions (inference, or
the forward of a tape-driven fill-drain step), 'backward' the rest (their F
having run in an earlier loop), 'all' everything (the loss inside; the only
phase an FB belongs to).

Pure Python; importing it does not import TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Callable, Iterable, Iterator, Sequence

from gpipe_tf import errors
from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.pipeline.schedule import ascii as ascii_lib
from gpipe_tf.pipeline.schedule import replay
from gpipe_tf.pipeline.schedule import table

__all__ = ['FB', 'PHASES', 'RECV', 'SCOPE', 'Among', 'Explained', 'FindScope',
           'FuseLast', 'Fusable', 'JoinBackward', 'Lower', 'Naming',
           'ReceiptScope', 'Scope', 'Senders', 'StagesDeferringW', 'Step',
           'StepError', 'TickProgram', 'Unjoined', 'Where']

Action = action_lib.Action
F, B, W, BW = action_lib.F, action_lib.B, action_lib.W, action_lib.BW
FB = action_lib.FB
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
    defers_w: FB: its backward is a B and its W runs later (a W action
      follows), else a BW.
  """
  kind: str
  stage: int
  keep: bool = False
  defers_w: bool = False


@dataclasses.dataclass(frozen=True)
class TickProgram:
  """A schedule lowered to ticks.

  Attributes:
    num_ticks: the loop's iterations.
    tick: the tick of every action of the phase.
    grid: grid[d][t] is device d's action at tick t, None when it idles.
    steps: steps[d] lists device d's distinct steps; branch j + 1 runs
      steps[d][j].
    branch: branch[d][t], 0 when device d idles at tick t.
    micro: micro[d][t], the micro-batch of that step (0 when idle).
    got_y: got_y[s][t], the micro-batch whose output stage s-1 made at tick
      t-1 and stage s takes in at tick t; -1 for none.
    got_dx: got_dx[s][t], the micro-batch whose input gradient stage s+1
      made at tick t-1 and stage s takes in at tick t; -1 for none.
    skips: skips[i], the (stashing stage, popping stage) of skip i, a
      tensor sent from the first straight to the second (stages apart).
    got_skip: got_skip[i][t], the micro-batch whose skip i the stashing
      stage's F made at tick t-1 and the popping stage takes in at tick t;
      -1 for none.
    got_dskip: got_dskip[i][t], the micro-batch whose skip i's gradient the
      popping stage's backward made at tick t-1 and the stashing stage takes
      in at tick t; -1 for none.
  """
  num_ticks: int
  tick: dict[Action, int]
  grid: tuple[tuple[Action | None, ...], ...]
  steps: tuple[tuple[Step, ...], ...]
  branch: tuple[tuple[int, ...], ...]
  micro: tuple[tuple[int, ...], ...]
  got_y: tuple[tuple[int, ...], ...]
  got_dx: tuple[tuple[int, ...], ...]
  skips: tuple[tuple[int, int], ...] = ()
  got_skip: tuple[tuple[int, ...], ...] = ()
  got_dskip: tuple[tuple[int, ...], ...] = ()

  def ToAscii(self, mark: tuple[int, int] | None = None,
              marks: frozenset[tuple[int, int]] = frozenset()) -> str:
    """One row per device, one column per tick: 'F3', 'B3', 'W3', 'BW3',
    'FB3', '..' idle; with `mark` (device, tick), that action drawn as
    '!label' (as Schedule.Validate draws a bad step), as is every (device,
    tick) of `marks`."""
    marks = marks | ({mark} if mark else set())
    return ascii_lib.Grid([
        [None if act is None else '!' * ((d, t) in marks) + act.label
         for t, act in enumerate(row)] for d, row in enumerate(self.grid)])

  def DeviceAt(self, act: Action) -> int:
    """The device that runs `act` (an action of the program)."""
    t = self.tick[act]
    return next(d for d, row in enumerate(self.grid) if row[t] == act)


def Fusable(schedule: table.Schedule) -> frozenset[tuple[int, int]]:
  """The pairs FuseLast fuses: the last stage's (s, m) whose backward
  directly follows F(s, m) on its device (or already runs with it)."""
  last = schedule.num_stages - 1
  return frozenset((s, m) for s, m in schedule.ForwardsFollowedByBackward()
                   if s == last)


def FuseLast(schedule: table.Schedule) -> table.Schedule:
  """The schedule with the last stage's F(s, m) and the B(s, m) or
  BW(s, m) that directly follows it on its device replaced by one FB(s, m)
  (a pass: the schedule is not changed). Only with the loss inside (phase
  'all'): that backward reads nothing but its own forward's loss."""
  last = schedule.num_stages - 1
  return _MergePairs(schedule, lambda act, nxt: (
      Action(FB, last, act.micro_batch)
      if act.kind == F and act.stage == last and nxt.kind in (B, BW) and
      (nxt.stage, nxt.micro_batch) == (last, act.micro_batch) else None))


def JoinBackward(schedule: table.Schedule) -> table.Schedule:
  """The schedule with every B(s, m) directly followed on its device by
  W(s, m) replaced by one BW(s, m) (a pass: the schedule is not changed).
  The result is valid when `schedule` is, and does the same work."""
  return _MergePairs(schedule, lambda act, nxt: (
      Action(BW, act.stage, act.micro_batch)
      if act.kind == B and nxt == Action(W, act.stage, act.micro_batch)
      else None))


def Unjoined(schedule: table.Schedule, program: 'TickProgram',
             act: Action) -> list[Action]:
  """The actions of `schedule` that an action of `program` (lowered from
  it after FuseLast and JoinBackward) runs: an FB is its F and its
  backward (a B when the program runs its W later, else the BW, itself
  its B and W when `schedule` splits them), a BW that JoinBackward made of
  a B and its W is both; any other action is itself. What a trace records
  against the schedule the user asked for."""
  if act.kind == FB:
    back = B if dataclasses.replace(act, kind=W) in program.tick else BW
    return [dataclasses.replace(act, kind=F)] + Unjoined(
        schedule, program, dataclasses.replace(act, kind=back))
  if act.kind == BW and schedule.DefersW(act.stage, act.micro_batch):
    return [dataclasses.replace(act, kind=kind) for kind in (B, W)]
  return [act]


def _MergePairs(schedule: table.Schedule,
                merge: Callable[[Action, Action], Action | None]
                ) -> table.Schedule:
  """`schedule` with every two actions that follow each other on a device
  and that merge(first, second) makes one action replaced by that action."""
  rows = []
  for acts in schedule.actions:
    row, i = [], 0
    while i < len(acts):
      merged = merge(acts[i], acts[i + 1]) if i + 1 < len(acts) else None
      row.append(merged or acts[i])
      i += 2 if merged else 1
    rows.append(row)
  return table.Schedule(rows, schedule.num_micro_batches,
                        schedule.stage_devices, schedule.name)


def StagesDeferringW(program: 'TickProgram') -> frozenset[int]:
  """The stages that defer W: some step of `program` runs a backward as B
  and its W later."""
  return frozenset(step.stage for row in program.steps for step in row
                   if step.kind in (B, W) or step.defers_w)


def _InPhase(act: Action, phase: str) -> bool:
  if phase == 'forward':
    return act.kind == F
  if phase == 'backward':
    return act.kind != F
  return True


def _Ticks(schedule: table.Schedule, phase: str) -> dict[Action, int]:
  """Each action's tick: its earliest start when every action takes one
  tick (replay.Replay), an action's inputs from an earlier phase ready from
  the start."""
  rows = [[a for a in acts if _InPhase(a, phase)]
          for acts in schedule.actions]
  present = {a for row in rows for a in row}

  def _Deps(act):
    return [d for d in schedule.Dependencies(act) if d in present]

  start = replay.Replay(rows, _Deps, lambda act: 1.0).start
  # In the schedule's order (what numbers each device's steps).
  return {act: int(start[act])
          for act in schedule.Order() if _InPhase(act, phase)}


def Lower(schedule: table.Schedule, *, phase: str = 'all',
          keep: Callable[[int, int], bool] = lambda s, m: True,
          skips: tuple[tuple[int, int], ...] = ()) -> TickProgram:
  """Lowers (a phase of) a validated schedule to its tick program.

  Args:
    schedule: the schedule (validated here), after the passes it should
      have (FuseLast, JoinBackward).
    phase: 'all', 'forward' or 'backward' (module docstring).
    keep: keep(s, m) is True when F(s, m) keeps its activations for its
      backward, False when the backward recomputes them.
    skips: per skip, (the stage that stashes it, the later stage that pops
      it): skip i arrives at its popping stage the tick after its stashing
      stage's F, its gradient at the stashing stage the tick after the
      popping stage's backward (got_skip, got_dskip); no stage in between
      takes it in.

  Raises:
    ScheduleError: the schedule is not valid (Schedule.Validate), the phase
      is unknown, or it has an FB and the phase is not 'all'.
  """
  schedule.Validate()
  if phase not in PHASES:
    raise table.ScheduleError(f'phase must be one of {PHASES}, got {phase!r}')
  fused = [a for acts in schedule.actions for a in acts if a.kind == FB]
  if fused and phase != 'all':
    raise table.ScheduleError(
        f"{fused[0]} needs phase 'all' (the loss inside), not {phase!r}: "
        'lower the schedule from before FuseLast')
  tick = _Ticks(schedule, phase)
  num_ticks = 1 + max(tick.values(), default=-1)
  k, num_stages = schedule.num_devices, schedule.num_stages
  grid = [[None] * num_ticks for _ in range(k)]
  steps: list[list[Step]] = [[] for _ in range(k)]
  branch = [[0] * num_ticks for _ in range(k)]
  micro = [[0] * num_ticks for _ in range(k)]
  got_y = [[-1] * num_ticks for _ in range(num_stages)]
  got_dx = [[-1] * num_ticks for _ in range(num_stages)]
  skips = tuple((int(a), int(b)) for a, b in skips)
  for a, b in skips:
    if not 0 <= a < b < num_stages:
      raise table.ScheduleError(
          f'a skip goes from stage {a} to stage {b}: it must go to a later '
          f'stage, of {num_stages}.')
  got_skip = [[-1] * num_ticks for _ in skips]
  got_dskip = [[-1] * num_ticks for _ in skips]
  for act, t in tick.items():
    s, m = act.stage, act.micro_batch
    d = schedule.DeviceOf(s)
    if t + 1 < num_ticks:
      if act.kind in (F, FB) and s + 1 < num_stages:
        got_y[s + 1][t + 1] = m
      if act.kind in (B, BW, FB) and s > 0:
        got_dx[s - 1][t + 1] = m
      for i, (a, b) in enumerate(skips):
        if act.kind in (F, FB) and s == a:
          got_skip[i][t + 1] = m
        if act.kind in (B, BW, FB) and s == b:
          got_dskip[i][t + 1] = m
    if act.kind == FB:
      step = Step(FB, s, True, schedule.DefersW(s, m))
    elif act.kind == W:
      step = Step(W, s)
    else:
      step = Step(act.kind, s, bool(keep(s, m)))
    if step not in steps[d]:
      steps[d].append(step)
    grid[d][t] = act
    branch[d][t] = 1 + steps[d].index(step)
    micro[d][t] = m
  return TickProgram(
      num_ticks, tick, tuple(tuple(r) for r in grid),
      tuple(tuple(r) for r in steps), tuple(tuple(r) for r in branch),
      tuple(tuple(r) for r in micro), tuple(tuple(r) for r in got_y),
      tuple(tuple(r) for r in got_dx), skips,
      tuple(tuple(r) for r in got_skip), tuple(tuple(r) for r in got_dskip))


# A step's name scope in a built step's graph (tick_graph): its stage, kind
# and micro-batch ('mb3') when built at its own tick, or its tick program
# column ('t7') when built in a loop's body; a switch loop's branch has none.
# Groups: stage, kind, 'mb' or 't', the number. Scope writes it.
SCOPE = re.compile(r'(?:^|/)stage(\d+)_([A-Z]+)(?:_(mb|t)(\d+))?/')


def Scope(step: Step, micro_batch: int | None = None,
          column: int | None = None) -> str:
  """The name scope tick_graph builds `step` under (FindScope reads it)."""
  at = (f'_mb{micro_batch}' if micro_batch is not None else
        '' if column is None else f'_t{column}')
  return f'stage{step.stage}_{step.kind}{at}'


# The scope kind of what a stage takes in at a tick (tick_graph's receipts
# of its neighbours' outputs, gradients and skips): not an action's.
RECV = 'RECV'


def ReceiptScope(stage: int, column: int | None) -> str:
  """The name scope of what `stage` takes in at the tick built at `column`
  (None: every tick of a switch loop), ``stage1_RECV_t4``: FindScope reads
  it as a step's, with kind RECV."""
  return Scope(Step(RECV, stage), column=column)


def Senders(program: TickProgram, stage: int,
            at: Iterable[int]) -> list[Action]:
  """The actions whose outputs, gradients or skips `stage` takes in at
  ticks `at`: each made it the tick before."""
  rows = [(program.got_y[stage], stage - 1),
          (program.got_dx[stage], stage + 1)]
  rows += [(got, a) for (a, b), got in zip(program.skips, program.got_skip)
           if b == stage]
  rows += [(got, b) for (a, b), got in zip(program.skips, program.got_dskip)
           if a == stage]
  return [act for t in at if t > 0 for row, sender in rows if row[t] >= 0
          for act in (r[t - 1] for r in program.grid)
          if act is not None and act.stage == sender]


def FindScope(text: str) -> tuple[int, str, int | None, int | None] | None:
  """(stage, kind, micro-batch or None, column or None) of the first step
  scope (Scope) in `text` (an op's name, an error message), or None."""
  found = SCOPE.search(text)
  if not found:
    return None
  n = None if found.group(4) is None else int(found.group(4))
  return (int(found.group(1)), found.group(2), n if found.group(3) == 'mb'
          else None, n if found.group(3) == 't' else None)


class StepError(errors.Error, RuntimeError):
  """An error raised while building or running one step of a tick program.

  Its message names the action (stage, kind, micro-batch), its tick and its
  device, and draws that device's row of the tick program with the action
  marked '!'; the error it was raised from is its __cause__. (Raised inside
  a function AutoGraph converts, it reaches the caller as TensorFlow's
  StagingError holding its message, as every named error does.)

  Attributes:
    action: the action (for a step built once for several ticks, as in a
      loop's body, the first it runs), or None where none is known.
    tick: that action's tick, or None.
    device: the device, or None.
    actions: every action it may have been (Among: an error TensorFlow
      reported while the step ran, in code several actions run), else
      (action,).
  """
  action: Action | None = None
  tick: int | None = None
  device: int | None = None
  actions: tuple[Action, ...] = ()

  def At(self, action: Action, tick: int, device: int) -> StepError:
    """This error, with its place set."""
    self.action, self.tick, self.device = action, tick, device
    self.actions = (action,)
    return self


def Where(program: TickProgram, stage: int, kind: str | None = None,
          micro_batch: int | None = None, column: int | None = None
          ) -> StepError:
  """A StepError (without a cause) naming the first action of `program` of
  `stage`, and of `kind`, `micro_batch` and tick `column` where given: its
  message says which, at which tick on which device, then draws the
  device's row with the action marked '!'."""
  acts = sorted((t, a) for a, t in program.tick.items()
                if a.stage == stage and kind in (None, a.kind) and
                micro_batch in (None, a.micro_batch) and column in (None, t))
  if not acts:
    return StepError(f'stage {stage} ({kind or "any kind"}, micro-batch '
                     f'{micro_batch}, tick {column}): no such action')
  t, act = acts[0]
  d = next(d for d, row in enumerate(program.grid) if row[t] == act)
  more = '' if len(acts) == 1 else (
      f' (the first of {len(acts)} actions it is built for)')
  return StepError(
      f'{act.kind} of stage {act.stage} on micro-batch {act.micro_batch} '
      f'at tick {t} on device {d}{more}:\n'
      + program.ToAscii(mark=(d, t)).splitlines()[d]).At(act, t, d)


def Among(program: TickProgram, actions: Sequence[Action]) -> StepError:
  """A StepError (without a cause) naming the action of `program` an error
  came from, as Where does; when it may have been any of several
  `actions` (code that several actions run, TensorFlow not saying which),
  it names them all, per kind and stage, and draws each of their devices'
  rows with every one of them marked '!'."""
  acts = sorted(set(actions), key=lambda a: (program.tick[a], a.stage))
  if len(acts) == 1:
    act = acts[0]
    return Where(program, act.stage, act.kind, act.micro_batch,
                 program.tick[act])
  groups: dict[tuple[str, int, int], list[Action]] = {}
  for act in acts:
    groups.setdefault((act.kind, act.stage, program.DeviceAt(act)),
                      []).append(act)
  said = []
  for (kind, stage, d), group in groups.items():
    said.append(f'{kind} of stage {stage} on micro-batch '
                f'{_Or(a.micro_batch for a in group)} at tick '
                f'{_Or(program.tick[a] for a in group)} on device {d}')
  rows = program.ToAscii(marks=frozenset(
      (program.DeviceAt(a), program.tick[a]) for a in acts)).splitlines()
  error = StepError(f'one of {len(acts)} actions, ' + '; or '.join(said) +
                    " (TensorFlow's error does not say which; a step run "
                    'eagerly, outside tf.function, names its action):\n' +
                    '\n'.join(rows[d] for d in sorted({
                        g[2] for g in groups})))
  error.actions = tuple(acts)
  return error


def _Or(items: Iterable[int]) -> str:
  """'1, 2 or 4'."""
  items = [str(i) for i in items]
  return items[0] if len(items) == 1 else (
      ', '.join(items[:-1]) + ' or ' + items[-1])


def Explained(error: Exception, where: StepError,
              note: str = '') -> Exception:
  """`error`, raised in the step `where` names, as the error to raise
  (from `error`): a gpipe_tf error (errors.Error, which already says what
  to change) is itself, with the place as a note; a TensorFlow OpError (an
  op that failed as it ran) a new error of its own type (so that ``except
  tf.errors.InvalidArgumentError`` still catches it) whose message starts
  with the place, with `where` as its ``where``; any other a StepError.
  `note`, if any, ends the message (or is one more note)."""
  if isinstance(error, errors.Error):
    error.add_note(f'in {where}')
    if note:
      error.add_note(note)
    return error
  message = f'{type(error).__name__} in {where}\n{error}{note}'
  if hasattr(error, 'node_def') and hasattr(error, 'error_code'):  # OpError.
    try:
      explained = type(error)(error.node_def, error.op, message)
    except TypeError:  # OpError itself takes its code.
      explained = type(error)(error.node_def, error.op, message,
                              error.error_code)
    explained.where = where
    return explained
  explained = StepError(message).At(where.action, where.tick, where.device)
  explained.actions = where.actions
  return explained


@contextlib.contextmanager
def Naming(program: TickProgram, stage: int | None = None,
           kind: str | None = None, micro_batch: int | None = None,
           column: int | None = None) -> Iterator[None]:
  """Building (or running) a step of `program`: an error raised inside is
  raised again from it as Explained says (a StepError; a TensorFlow OpError
  of an op run eagerly keeps its type; a gpipe_tf error, which already says
  what to change, is itself with the place as a note), naming the action
  (Where) of `stage`, `kind`, `micro_batch` and `column`. With no stage,
  the step is the one whose name scope (Scope) the error's message names,
  and an error that names none goes on as it is."""
  try:
    yield
  except StepError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    if getattr(e, 'where', None) is not None:  # Explained already.
      raise
    found = (stage, kind, micro_batch, column) if stage is not None else (
        FindScope(str(e)))
    if found is None:
      raise
    explained = Explained(e, Where(program, *found))
    if explained is e:
      raise
    raise explained from e
