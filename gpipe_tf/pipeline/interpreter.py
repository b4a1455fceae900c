"""Runs tick programs (schedule/ticks.py) over the cells' programs: the one interpreter of every schedule.

A step goes through three functions, each a function of what the one before
returned (nothing is kept between calls)::

    Compile(cells, schedule, ...)          -> Compiled  (traced, no tensors)
    Start(compiled, inputs, labels, seed)  -> Feeds, State
    Run(compiled, feeds, program, state)   -> State     (once per tick program)

then ``Merged`` (the outputs, the input gradients), ``Gradients``,
``LossSums`` and ``MoveBatchNormStats`` read the results out of the final
State, and ``Done`` marks its TensorArrays used. The tape path runs two
tick programs (its forward, then in the gradient ``FeedOutputGradients``
and its backward).

Every stage keeps, on its own device, one slot per micro-batch for each
tensor its steps pass on to later steps (slots.Slots). A step of stage s on
micro-batch m reads its slots at m, runs one piece of the cell's program
(cell_program.Piece) and writes what it made back (``_Step``); tick_graph.py
builds the ticks that order the steps, as the plan (periods.Plan) says:
whole, its repeats folded into while loops, or one switch loop.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import tensorflow as tf

from gpipe_tf.layers import normalization
from gpipe_tf.layers import precision
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import cell as cell_lib
from gpipe_tf.pipeline import cell_program as program_lib
from gpipe_tf.pipeline import microbatch
from gpipe_tf.pipeline import roles
from gpipe_tf.pipeline import slots as slots_lib
from gpipe_tf.pipeline import tensor_loop as tl
from gpipe_tf.pipeline import tf_internals
from gpipe_tf.pipeline import tick_graph
from gpipe_tf.pipeline.roles import Freed
from gpipe_tf.pipeline.roles import Role
from gpipe_tf.pipeline.roles import Store
from gpipe_tf.pipeline.schedule import periods
from gpipe_tf.pipeline.schedule import table
from gpipe_tf.pipeline.schedule import ticks as ticks_lib

__all__ = []  # Internal to the engine: its types are in docs/pipeline.md.

State = tuple  # of slots.Slots, one per stage


@dataclasses.dataclass(frozen=True)
class Compiled:
  """A pipelined step, traced: every stage's program and where its packed
  slots keep each tensor. Holds no tensor of a step; made by Compile.

  Attributes:
    cells: the S cells, cell s on the device of stage s.
    schedule: the validated schedule.
    programs: programs[s], stage s's cell_program.CellProgram.
    layouts: layouts[s], stage s's slots.Layout (None in inference).
    ticks: the tick programs the step runs, in order (Run takes them).
    plans: plans[i], the segments ticks[i] is built as (periods.Plan).
    loss_inside: whether the last stage computes the loss.
    input_grads: whether stage 0 returns its input gradients.
    batch: examples per micro-batch, None when sizes vary.
    routes: the skips that cross stages (cell.Routes), in the order of the
      tick programs' skip rows.
  """
  cells: tuple[cell_lib.Cell, ...]
  schedule: table.Schedule
  programs: tuple[program_lib.CellProgram, ...]
  layouts: tuple[slots_lib.Layout | None, ...]
  ticks: tuple
  plans: tuple
  loss_inside: bool
  input_grads: bool
  batch: int | None
  routes: tuple[cell_lib.Route, ...] = ()


@dataclasses.dataclass(frozen=True)
class Feeds:
  """What every tick of a step reads and none writes; made by Start.

  Attributes:
    labels: the flat labels split the same way, on the last stage's device.
    seeds: seeds[s], the step seed on stage s's device (micro-batch m's is
      FoldIn(seed, m)).
    sizes: the micro-batches' sizes (a list of ints, or a tensor).
  """
  labels: tuple
  seeds: tuple
  sizes: Any


def Compile(cells: Sequence[cell_lib.Cell], schedule: table.Schedule,
            structure: Any, specs: Sequence[Any], training: bool,
            ticks: Sequence[ticks_lib.TickProgram], seed: tf.Tensor,
            jit_compile: bool, execution: str, budget: float,
            head: program_lib.LossHead | None = None,
            input_grads: bool = True) -> Compiled:
  """Traces every cell's program (or takes it from the cell's cache) and
  plans how each tick program is built.

  Args:
    cells: the S cells.
    schedule: the validated schedule.
    structure: the first stage's input nest.
    specs: one micro-batch's flat input specs (None for a None leaf; the
      batch dimension None when micro-batch sizes vary).
    training: training mode.
    ticks: the tick programs the step will run, in order. A stage whose
      backward one of them runs as B and its W later
      (ticks.StagesDeferringW) gets a program that defers W; every other,
      one whose backward is never cut into B and W.
    seed: the step seed (for its spec).
    jit_compile: compile the cells' pieces with XLA.
    execution: how the tick programs are built (periods.Plan).
    budget: the ops a 'loop' execution may build a program whole or
      folded with (periods.Plan).
    head: with the loss inside, the loss (the last stage's).
    input_grads: whether stage 0 differentiates its inputs.

  Returns:
    The Compiled step, also kept in the first cell's ``compiled`` (a few,
    latest first), where run_errors reads which action an op that failed
    as the step ran belongs to.
  """
  defers_w = frozenset().union(*map(ticks_lib.StagesDeferringW, ticks))
  routes = cell_lib.Routes(cells)
  seed_spec = tf.TensorSpec(seed.shape, seed.dtype)
  if any(t.skips != SkipPairs(cells) for t in ticks):
    raise ValueError('tick programs lowered without the cells\' skips '
                     '(ticks.Lower(skips=SkipPairs(cells)))')
  structs, in_specs = [structure], [list(specs)]
  skip_specs: dict[str, Any] = {}  # Of each stashed name, from its cell.
  last = len(cells) - 1
  programs = [None] * len(cells)

  def _Key(s, dy_present=None, dskip_present=None):
    stage_head = head if s == last else None
    return program_lib.ProgramKey(
        program_lib.NestKey(structs[s]), tuple(map(repr, in_specs[s])),
        tuple(map(repr, [skip_specs[n] for n in cells[s].skip_in])),
        training, None if stage_head is None
        else (head.loss_fn, program_lib.NestKey(head.label_struct),
              tuple(map(repr, head.label_specs)), head.scaled),
        input_grads or s > 0, dy_present, dskip_present,
        precision.CurrentPolicy(), jit_compile, s in defers_w, s == last)

  def _Program(s, dy_present=None, dskip_present=None, deferred=False):
    """Cell s's program, traced (its backward deferred: Finish)."""
    with ticks_lib.Naming(ticks[0], s):  # A layer's error: where it is.
      return program_lib.CellProgram(
          cells[s], structs[s], in_specs[s], seed_spec, training,
          head if s == last else None, input_grads or s > 0, dy_present,
          jit_compile, s in defers_w,
          [skip_specs[n] for n in cells[s].skip_in], dskip_present,
          s == last, deferred=deferred)

  # Cells in order, each one's outputs the next one's input specs: from a
  # program of the cell cached for these inputs (whatever gradients it is
  # fed), else from its forward traced now. A training program's backward
  # needs to know which gradients the next cell's gives back, so it is
  # traced after (last cell first), into the same graph: each forward is
  # traced once.
  pending = {}  # Training programs whose backward is still to trace.
  for s, cell in enumerate(cells):
    bare = _Key(s)
    cached = next((p for k, p in cell.programs.items()
                   if dataclasses.replace(k, dy_present=None,
                                          dskip_present=None) == bare),
                  None)
    if cached is None:
      cached = _Program(s, deferred=True)
      if training:
        pending[s] = cached
      else:  # Whole already: the forward is the program.
        cell.programs[bare] = cached
    if s < last:
      skip_specs.update(zip(cell.skip_out, cached.Specs(Role.SKIP_OUT)))
      structs.append(cached.out_struct)
      in_specs.append(cached.out_specs)
  for s in reversed(range(len(cells))):
    dy_present = dskip_present = None
    if training and s < last:
      dy_present = tuple(g is not None
                         for g in programs[s + 1].tensors[Role.DX])
      dskip_present = tuple(
          programs[r.dst].tensors[Role.DSKIP_IN][r.in_index] is not None
          for r in routes if r.src == s)
    key = _Key(s, dy_present, dskip_present)
    if key not in cells[s].programs:
      if s in pending:
        program = pending.pop(s)
        with ticks_lib.Naming(ticks[0], s):  # A layer's error: where it is.
          program.Finish(dy_present, dskip_present)
      else:
        program = _Program(s, dy_present, dskip_present)
      cells[s].programs[key] = program
    programs[s] = cells[s].programs[key]
  layouts = tuple(slots_lib.LayoutOf(p, schedule.num_micro_batches)
                  if training else None for p in programs)
  plans = tuple(_Plan(programs, t, execution, budget) for t in ticks)
  batch = next((x.shape[0] for x in specs if tl.HasBatch(x)), None)
  cells[0].compiled.appendleft(Compiled(
      tuple(cells), schedule, tuple(programs), layouts, tuple(ticks), plans,
      head is not None, input_grads, batch, routes))
  return cells[0].compiled[0]


def SkipPairs(cells: Sequence[cell_lib.Cell]
              ) -> tuple[tuple[int, int], ...]:
  """(stashing stage, popping stage) of each skip that crosses stages, in
  Compiled.routes' order: what ticks.Lower takes as `skips`."""
  return tuple((r.src, r.dst) for r in cell_lib.Routes(cells))


def _Plan(programs: Sequence[program_lib.CellProgram],
          program: ticks_lib.TickProgram,
          execution: str, budget: float) -> tuple:
  """periods.Plan of a tick program, each tick costing the ops of the
  pieces it runs."""
  def _Ops(step):
    with ticks_lib.Naming(program, step.stage, step.kind):  # A prune's.
      return programs[step.stage].Piece(step).num_ops

  ops = [[_Ops(step) for step in steps] for steps in program.steps]
  costs = [1 + sum(ops[d][row[t] - 1] for d, row in enumerate(program.branch)
                   if row[t]) for t in range(program.num_ticks)]
  return periods.Plan(periods.Columns(program), execution, budget, costs)


def _Split(c: Compiled, s: int, flat: Sequence[Any], sizes: Any,
           read_once: bool = False) -> list:
  """Per flat tensor, on stage s's device, a TensorArray of its M
  micro-batches (None stays None; a tensor without batch dimension is
  shared); `read_once` for slots a step takes (slots.Take)."""
  m, batch = c.schedule.num_micro_batches, None if read_once else c.batch
  with tf.device(c.cells[s].device):
    return [tl.TensorArrayOf(tl.SpecOf(x, batch), m, read_once).split(x, sizes)
            if tl.HasBatch(x) else x for x in flat]


def Start(compiled: Compiled, flat: Sequence[Any], labels: Sequence[Any],
          seed: tf.Tensor) -> tuple[Feeds, State]:
  """The step's Feeds and every stage's empty slots.

  Args:
    compiled: the Compiled step.
    flat: stage 0's flat inputs (None leaves stay None).
    labels: with the loss inside, the flat labels (else empty).
    seed: the step seed.
  """
  c = compiled
  sizes = microbatch.Sizes(flat, c.schedule.num_micro_batches)
  seeds = []
  for cell in c.cells:
    with tf.device(cell.device):
      seeds.append(tf.identity(seed))
  state = [slots_lib.Make(c, s) for s in range(len(c.cells))]
  state[0] = state[0].With({Role.X: _Split(c, 0, flat, sizes,
                                             read_once=True)})
  return Feeds(tuple(_Split(c, -1, labels, sizes)), tuple(seeds),
               sizes), tuple(state)


def FeedOutputGradients(compiled: Compiled, feeds: Feeds, state: State,
                        dys: Sequence[Any]) -> State:
  """`state` with the gradients of the merged outputs (one per flat output)
  split into the last stage's dy slots (a tape-driven backward). Only the
  float outputs have slots; TensorFlow hands the pipeline's custom gradient
  zeros, not None, for a float output the loss does not read
  (transparency_test's testAnOutputTheLossIgnores)."""
  c = compiled
  slots = state[-1]
  with tf.device(c.cells[-1].device):
    dys = [g if ta is not None else None
           for ta, g in zip(slots.Of(Role.DY), dys)]
    dy = _Split(c, -1, dys, feeds.sizes, read_once=True)
  return state[:-1] + (slots.With({Role.DY: dy}),)


def Run(compiled: Compiled, feeds: Feeds, program: ticks_lib.TickProgram,
        state: State, trace: Any = None) -> State:
  """Builds one of compiled.ticks over `state`; returns the state after
  its last tick. With a trace.ScheduleTrace, every step stamps its start
  (once its inputs are ready) and end (once its outputs are)."""
  c = compiled
  plan = c.plans[c.ticks.index(program)]
  if trace is not None:
    if trace.schedule is None:
      trace.schedule = c.schedule
    state = list(state)
    for s, cell in enumerate(c.cells):
      with tf.device(cell.device):
        state[s] = state[s]._replace(stamps=tuple(
            tf.TensorArray(tf.float64, size=program.num_ticks,
                           element_shape=[]) for _ in range(2)))
  state = tick_graph.TickGraph(
      [cell.device for cell in c.cells], c.schedule,
      functools.partial(_Step, c, feeds), c.routes).Build(program, plan, state)
  if trace is not None:
    for row in program.grid:
      for t, act in enumerate(row):
        if act is not None:
          starts, ends = state[act.stage].stamps
          start, end = starts.read(t), ends.read(t)
          for part in ticks_lib.Unjoined(c.schedule, program, act):
            trace.Record(part, start, end)
  return state


def _Step(c: Compiled, feeds: Feeds, step: ticks_lib.Step, m: Any, t: Any,
          mine: slots_lib.Slots, ready: dict) -> tuple[slots_lib.Slots, list]:
  """Runs one step of stage step.stage on micro-batch m at tick t: (the
  stage's new slots, the tensors the step made). `ready`: per slot role,
  values that arrived for it in the same code (tick_graph._Ready), taken
  instead of the slot's. What it reads, frees and writes is the table's
  (roles.Role)."""
  s = step.stage
  program = c.programs[s]
  piece = program.Piece(step)
  layout = c.layouts[s]
  new, merged, fed = {}, {}, {}
  recomputes = step.kind in (ticks_lib.B, ticks_lib.BW) and not step.keep
  # Inputs and skips (Freed.LAST_READ) are freed by the last step that
  # reads them: they live until their reader has run (a recomputing
  # backward reads them again). That is an F that keeps its activations
  # (its backward reads those), an FB, a recomputing B or BW, or any step
  # in inference.
  last = (not program.training or step.kind == ticks_lib.FB or
          (step.kind == ticks_lib.F and step.keep) or recomputes)
  for role in piece.reads:
    if role.store is Store.SLOTS and mine.Of(role) is not None:
      # A recomputing backward reads its forward's inputs from the slot,
      # never as the tensor its forward took (ready): given the same
      # tensor, TensorFlow's optimiser merges the recompute with the
      # forward, whose activations then live until the backward
      # (interpreter_test's testRematSavesMemory).
      again = recomputes and role.freed is Freed.LAST_READ
      fed[role], new[role] = slots_lib.Take(
          mine.Of(role), m, program.Specs(role),
          empty=last or role.freed is Freed.TAKEN,
          known=None if again else ready.get(role))
    elif role.store is Store.PACKED:
      fed[role], new[role] = layout[role].Take(mine.Of(role), m)
  if Role.SEED in piece.reads:
    fed[Role.SEED] = (random_seeds.FoldIn(feeds.seeds[s], m),)
  if Role.LABELS in piece.reads:
    fed[Role.LABELS] = [ta.read(m) if isinstance(ta, tf.TensorArray) else ta
                        for ta in feeds.labels]  # A shared label is itself.
  fed = roles.Tensors(fed)
  if mine.stamps is not None:
    with tf.control_dependencies(
        [x for x in fed.Present(*piece.reads) if isinstance(x, tf.Tensor)]):
      start = tf.timestamp()
  out = piece(fed)
  made = out.Present(*piece.makes)
  for role in piece.makes:
    # The latest y, dx and skips stay for a receiver; the last stage's y and
    # the first's dx are merged over micro-batches (Role.merged).
    if mine.Merged(role) is not None:
      merged[role] = slots_lib.Write(mine.Merged(role), m, out[role])
    elif role.store is Store.LATEST and mine.Of(role) is not None:
      new[role] = list(out[role])
    elif role.store is Store.PACKED:
      new[role] = layout[role].Write(new.get(role, mine.Of(role)), m,
                                     out[role])
    elif role is Role.BN:
      new[role] = layout[role].Write(mine.Of(role), 0, [
          a + b for a, b in zip(layout[role].Read(mine.Of(role)), out[role])])
    elif role is Role.SUMS:
      new[role] = [a + b for a, b in zip(mine.Of(role), out[role])]
    elif role is Role.DWS:
      # The sums are taken from their slot before they are added to, so
      # that the add may write in place and the sums of the micro-batches
      # before are freed as it runs: read in place, they lived on beside
      # the new ones until the slot's next write (benchmarks/benchmark's
      # log).
      sums, emptied = layout[role].Take(mine.Of(role), 0)
      new[role] = layout[role].Write(emptied, 0, [
          None if g is None else (g if prev is None else prev + g)
          for g, prev in zip(out[role], sums)])
      # The device's next step waits for the add as well as the piece:
      # else the pieces ran ahead of their adds, and several
      # micro-batches' gradients waited beside the sums (zb_h1's Ws).
      made += [x for x in new[role] if x is not None]
  others = {}
  if mine.stamps is not None:
    with tf.control_dependencies(tick_graph.Finished(made) + [start]):
      end = tf.timestamp()
    others['stamps'] = (mine.stamps[0].write(t, start),
                        mine.stamps[1].write(t, end))
  return mine.With(new, merged, **others), made


def Merged(compiled: Compiled, state: State, s: int, role: Role) -> list:
  """Stage s's merged slots of `role` (Role.merged), concatenated over
  micro-batches (flat; None where none): the last stage's outputs
  (Role.Y), or the first stage's input gradients (Role.DX)."""
  with tf.device(compiled.cells[s].device):
    return [None if ta is None else ta.concat()
            for ta in state[s].Merged(role)]


def LossSums(compiled: Compiled, state: State) -> Any:
  """The loss.Sums of the mini-batch."""
  return tf.nest.pack_sequence_as(compiled.programs[-1].sums_struct,
                                  state[-1].sums)


def Gradients(compiled: Compiled, state: State) -> dict:
  """{variable.ref(): gradient}, summed over micro-batches and over the
  stages that read the variable."""
  grads: dict = {}
  for s, program in enumerate(compiled.programs):
    with tf.device(compiled.cells[s].device):
      sums = program.dws_flat.Unpack(
          compiled.layouts[s][Role.DWS].Read(state[s].Of(Role.DWS)))
    for v, g in zip(program.variables, sums):
      if g is None:
        continue
      if v.ref() in grads:
        with tf.device(v.device):
          g = grads[v.ref()] + g
      grads[v.ref()] = g
  return grads


def MoveBatchNormStats(compiled: Compiled, state: State) -> None:
  """Moves every BatchNorm layer's statistics once per step, from every
  stage's sums (normalization.DeferredMovingStats)."""
  stats = normalization.DeferredMovingStats()
  for s, (program, slots) in enumerate(zip(compiled.programs, state)):
    if not program.bn_layers:
      continue
    with tf.device(compiled.cells[s].device):
      # Summed over replicas as the stage's packed vectors: one all-reduce
      # a dtype, not three a layer.
      bn = program.bn_flat.Unpack(normalization.SumAcrossReplicas(
          *compiled.layouts[s][Role.BN].Read(slots.Of(Role.BN))))
    for i, layer in enumerate(program.bn_layers):
      stats.Add(layer, *bn[3 * i:3 * i + 3])
  stats.Apply(summed_across_replicas=True)


def Done(state: State) -> None:
  """Marks the TensorArrays of a final state used (tf_internals.MarkUsed):
  the ones no later op reads were superseded, not forgotten."""
  for slots in state:
    for leaf in tf.nest.flatten(slots):
      tf_internals.MarkUsed(leaf)
