"""Builds a tick program into a step's graph: tick by tick, as while loops over its repeats, or as one switch loop.

The plan (schedule/periods.Plan) says which. Every tick first moves what
neighbours made in the previous tick into the slots (boundary tensors between
neighbours, a skip from the stage that stashed it straight to the one that
pops it, its gradient back the same way), then every device runs the step the program gives it::

    tick t:  receive(x, dy,  ->  device 0: stage 0's step at t
             skips and their
             gradients)
                                 device 1: stage 1's step at t ...

A tick built on its own (STATIC, and each tick of a REPEAT loop's body)
picks each device's step when the graph is built and chains it after the
device's previous step by a control dependency; a SWITCH loop picks it at
run time, with one ``tf.switch_case`` per stage over that stage's steps
(branch 0 idles), chained on the device's token. Loops carry every stage's
slots (slots.py) and its token; which micro-batch a step works on is read
from the program's tables by tick, so one body serves every iteration.
What a step does with its slots is the interpreter's (interpreter.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import tensorflow as tf

from gpipe_tf.pipeline import cell as cell_lib
from gpipe_tf.pipeline import slots as slots_lib
from gpipe_tf.pipeline import tensor_loop as tl
from gpipe_tf.pipeline.roles import Link
from gpipe_tf.pipeline.roles import Role
from gpipe_tf.pipeline.schedule import periods
from gpipe_tf.pipeline.schedule import table
from gpipe_tf.pipeline.schedule import ticks as ticks_lib

__all__ = []  # Internal to the engine: its types are in docs/pipeline.md.

_RECEIVED = tuple(r for r in Role if r.source is not None)


def Finished(made: Sequence[tf.Tensor]) -> list:
  """Tensors that exist once every one of `made` is computed. A control
  dependency on a function call's output itself waits only for the call's
  side effects once TensorFlow inlines the call, not for its data; one on
  an identity of it waits for the data."""
  return [tf.identity(x) for x in made if isinstance(x, tf.Tensor)]


def _After(done: Sequence[tf.Tensor]) -> Any:
  """A tick built on its own: a device's step starts after its previous
  step (a control dependency); without it the dataflow executor would run
  the steps of a device in whatever order their inputs allow, and neither a
  schedule's order nor its memory bound would hold."""
  return tf.control_dependencies(list(done))


def _Ready(arrived: dict | None, s: int, mine: slots_lib.Slots,
           micro: Sequence[int], col: int | None, offsets: tuple) -> dict:
  """What arrived for stage s's step at column `col` (on micro-batch
  micro[col + o] at each of the ticks col + o the code serves) earlier in
  the same straight-line code: {Role: per flat tensor, the value or None}.

  The step takes these values themselves rather than reading its slot. A
  slot is one TensorArray of every micro-batch, so a read of it waits for
  every write built before it: in a schedule whose neighbour sends a later
  micro-batch's tensor before this step in tick order (interleaved 1F1B's
  gradients), the step would wait for that later micro-batch as well, a
  wait the schedule does not have. The value is still written, and the
  step still empties its slot, so a loop, a later reader and memory see
  the slot as before.
  """
  ready: dict = {}
  for (stage, role, j), got in (arrived or {}).items():
    if stage != s:
      continue
    for row, c, value in got:
      if all(row[c + o] == micro[col + o] for o in offsets):
        if j is None:
          ready[role] = list(value)
        else:
          ready.setdefault(role, [None] * len(mine.Of(role)))[j] = value
  return ready


@dataclasses.dataclass(frozen=True)
class TickGraph:
  """Builds tick programs over the stages' slots.

  Attributes:
    devices: stage s's device.
    schedule: the validated schedule.
    step: step(ticks.Step, m, t, slots, ready) -> (the stage's new slots,
      the tensors the step made): runs one step of a stage on micro-batch m
      (an int, or a tensor in a loop) at tick t; `ready` maps a slot role to
      what arrived for this step earlier in the same straight-line code
      (per flat tensor, None where it is to be read from the slot).
    routes: the skips that cross stages (cell.Routes), in the order of the
      tick programs' skip rows.
  """

  devices: Sequence[str]
  schedule: table.Schedule
  step: Callable[..., tuple[slots_lib.Slots, list]]
  routes: Sequence[cell_lib.Route] = ()

  def Build(self, program: ticks_lib.TickProgram,
            plan: Sequence[periods.Segment],
            slots: Sequence[slots_lib.Slots]) -> tuple:
    """Builds `program` as `plan` (periods.Plan) says, over every stage's
    `slots`; returns the slots after its last tick."""
    done: dict[int, list] = {}
    slots = tuple(slots)
    for seg in plan:
      if seg.kind == periods.STATIC:
        arrived: dict = {}
        for t in range(seg.start, seg.end):
          slots = self._Tick(program, t, t, slots, done, arrived)
        continue
      slots = self._Tokens(slots, done)
      if seg.kind == periods.REPEAT:
        body = lambda i, *st, seg=seg: self._Period(program, seg, i, st)
      else:
        body = lambda i, *st, seg=seg: self._Tick(program, None,
                                                  seg.start + i, st)
      slots = tl.RunTicks(seg.repeats, body, slots, self.schedule.num_devices)
      done = self._TokenWaits(slots)
    return slots

  def _Tokens(self, slots: Sequence[slots_lib.Slots], done: dict) -> tuple:
    """`slots` with each device's token (kept by its first stage) made once
    the device's steps in `done` have finished: what orders a loop's steps
    after those built before it."""
    slots = list(slots)
    for d, finished in done.items():
      s = self.schedule.StagesOn(d)[0]
      with tf.device(self.devices[s]), _After(finished):
        slots[s] = slots[s]._replace(token=tf.identity(slots[s].token))
    return tuple(slots)

  def _TokenWaits(self, slots: Sequence[slots_lib.Slots]) -> dict:
    """Per device, what its next step waits on: its token."""
    return {d: [slots[self.schedule.StagesOn(d)[0]].token]
            for d in range(self.schedule.num_devices)}

  def _Period(self, program: ticks_lib.TickProgram, seg: periods.Segment,
              i: tf.Tensor, slots: Sequence[slots_lib.Slots]) -> tuple:
    """Iteration i of a REPEAT segment: its period's ticks, straight-line,
    each device's steps after its token and its token after them."""
    done = self._TokenWaits(slots)
    first = seg.start + i * seg.period
    arrived: dict = {}
    offsets = tuple(range(0, seg.period * seg.repeats, seg.period))
    for j in range(seg.period):
      slots = self._Tick(program, seg.start + j, first + j, slots, done,
                         arrived, offsets)
    return self._Tokens(slots, done)

  def _Tick(self, program: ticks_lib.TickProgram, col: int | None, t: Any,
            slots: Sequence[slots_lib.Slots], done: dict | None = None,
            arrived: dict | None = None, offsets: tuple = (0,)) -> tuple:
    """Builds tick t (an int, or a loop's tensor).

    With `col` (a tick whose column, periods.Columns, tick t shares) each
    device's step is picked now and ordered after its steps in `done`, and
    is handed what `arrived` for it in the same straight-line code (the
    ticks col + each of `offsets` share the code: a loop's iterations);
    without, by a tf.switch_case per stage, ordered on the device's token.
    """
    slots = list(slots)
    for s, device in enumerate(self.devices):
      with tf.device(device), tf.name_scope(ticks_lib.ReceiptScope(s, col)):
        slots[s] = self._Receive(program, s, col, t, slots, arrived)
    for d in range(self.schedule.num_devices):
      on_d = self.schedule.StagesOn(d)
      steps = program.steps[d]
      if not steps:
        continue
      with tf.device(self.devices[on_d[0]]):
        m = slots_lib.Gather(program.micro[d], t)
        if col is not None:
          index = program.branch[d][col]
          if index == 0:
            continue
          step = steps[index - 1]
          mb = m if isinstance(m, int) else None  # Else a loop's body.
          ready = _Ready(arrived, step.stage, slots[step.stage],
                         program.micro[d], col, offsets)
          with _After(done.get(d, [])), tf.name_scope(ticks_lib.Scope(
              step, mb, col)), ticks_lib.Naming(program, step.stage,
                                                step.kind, mb, col):
            slots[step.stage], made = self.step(step, m, t,
                                                slots[step.stage], ready)
          done[d] = Finished(made) or done.get(d, [])
          continue
        # One switch per stage over that stage's steps (branch 0 idles),
        # chained on the device's token: a switch costs executor ops per
        # branch and per state tensor at every tick, so V stages' switches
        # of a few branches and their own state each cost less than one
        # switch over all of the device's steps and state.
        token = slots[on_d[0]].token
        for s in on_d:
          mine = [j for j, step in enumerate(steps) if step.stage == s]
          if not mine:
            continue
          row = [1 + mine.index(b - 1) if b and (b - 1) in mine else 0
                 for b in program.branch[d]]
          state = slots[s]._replace(token=token)
          compact = tl.Compact(state)

          def _Branch(step, state=state, compact=compact, m=m):
            # The device's previous step has finished (its token), and the
            # next one waits for this one's: ticks overlap across devices,
            # never on one.
            with _After([state.token]), tf.name_scope(ticks_lib.Scope(
                step)), ticks_lib.Naming(program, step.stage, step.kind):
              new, made = self.step(step, m, t, state, {})
            with _After(Finished(made)):
              new = new._replace(token=tf.identity(new.token))
            return compact.Values(new)

          branches = [compact.Values] + [
              lambda step=steps[j], run=_Branch: run(step) for j in mine]
          slots[s] = compact.Pack(tf.switch_case(
              slots_lib.Gather(row, t), branches))
          token = slots[s].token
        # The device's next tick starts after its last stage's switch.
        slots[on_d[0]] = slots[on_d[0]]._replace(token=token)
    return tuple(slots)

  def _Receive(self, program: ticks_lib.TickProgram, s: int,
               col: int | None, t: Any, slots: list,
               arrived: dict | None) -> slots_lib.Slots:
    """Stage s takes in what its neighbours made at tick t-1: each receipt
    is written at the slot its row (TickProgram.got_*) says arrives at tick
    t, and one built at a column is also noted in `arrived` (_Ready).

    With `col`, only where something arrives. In a SWITCH loop every tick
    writes: a tick without a receipt writes into the spare slot M, which
    no step reads. A conditional write would cost more than the write: its
    predicate, pivot and data cross devices as live or dead tensors at
    every tick whether or not anything arrives.
    """
    mine = slots[s]
    # (slot role, its flat index or None for all, receipt row, value): per
    # role the table says arrives (Role.source), from its sender's role.
    receipts = []
    for role in _RECEIVED:
      sender, link = role.Sender(), role.source[1]
      if mine.Of(role) is None:  # dy and dskip_out in inference, say.
        continue
      if link is Link.PREVIOUS and s > 0:
        receipts.append((role, None, program.got_y[s],
                         slots[s - 1].Of(sender)))
      if link is Link.NEXT and s + 1 < len(slots):
        receipts.append((role, None, program.got_dx[s],
                         slots[s + 1].Of(sender)))
      for i, r in enumerate(self.routes):
        if link is Link.STASHER and r.dst == s:
          receipts.append((role, r.in_index, program.got_skip[i],
                           slots[r.src].Of(sender)[r.out_index]))
        if link is Link.POPPER and r.src == s:
          receipts.append((role, r.out_index, program.got_dskip[i],
                           slots[r.dst].Of(sender)[r.in_index]))
    spare = self.schedule.num_micro_batches
    for role, j, row, value in receipts:
      arrays = mine.Of(role)
      if row[col] < 0 if col is not None else all(m < 0 for m in row):
        continue
      if arrived is not None and col is not None:
        # One copy onto this device for the slot and the step: one transfer.
        copy = lambda v: None if v is None else tf.identity(v)
        value = [copy(v) for v in value] if j is None else copy(value)
        arrived.setdefault((s, role, j), []).append((row, col, value))
      m = slots_lib.Gather(tuple(spare if m < 0 else m for m in row), t)
      arrays = list(arrays)
      if j is None:
        arrays = slots_lib.Write(arrays, m, value)
      elif arrays[j] is not None:
        arrays[j] = arrays[j].write(m, value)
      mine = mine.With({role: arrays})
    return mine
