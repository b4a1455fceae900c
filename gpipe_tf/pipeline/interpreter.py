"""Runs a tick program (schedule/ticks.py) over the cells' pieces: the one interpreter of every schedule.

Every stage keeps, on its own device, one slot per micro-batch for each
tensor its steps pass on to later steps::

    x       its forward input        written by the stage before (or split
                                     from the mini-batch, stage 0)
    dy      its output gradients     written by the stage after (or split
                                     from the upstream gradient, last stage)
    saved   a kept forward's activations, for its B or BW
    pinned  the non-trainable values a recomputed forward must reread
    wcut    what its W reads from its B

plus the running sums of its weight gradients, BatchNorm statistics and (last
stage) loss sums; saved, pinned, wcut and the sums are packed, one TensorList
per dtype (slots.Layout). A step of stage s on micro-batch m reads its slots
at m, runs one piece of the cell's program (cell_program.py) and writes what
it made back (``_Step``); tick_graph.py builds the ticks that order the
steps: ``execution='loop'`` folds the program's repeats into while loops
(schedule/periods.py), so the step's graph stops growing with M;
``'unrolled'`` builds every tick on its own, a graph that grows with M, kept
as the loop's reference. Both run the same pieces in the same order.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from gpipe_tf.layers import precision
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import cell_program as program_lib
from gpipe_tf.pipeline import microbatch
from gpipe_tf.pipeline import slots as slots_lib
from gpipe_tf.pipeline import tensor_loop as tl
from gpipe_tf.pipeline import tick_graph
from gpipe_tf.pipeline.schedule import ticks as ticks_lib

__all__ = ['EXECUTIONS', 'Interpreter']

EXECUTIONS = ('loop', 'unrolled')


class Interpreter:
  """Runs the cells' programs in the order of tick programs.

  Args:
    cells: the S cells, cell s on the device of stage s.
    schedule: the validated schedule.
    seed: the step seed; micro-batch m's is FoldIn(seed, m).
    execution: 'loop' or 'unrolled' (module docstring).
    trace: an optional trace.ScheduleTrace; every step then stamps its start
      (once its inputs are ready) and end (once its outputs are).
  """

  def __init__(self, cells: Sequence[Any], schedule: Any, seed: tf.Tensor,
               execution: str, trace: Any = None) -> None:
    if execution not in EXECUTIONS:
      raise ValueError(f'execution must be one of {EXECUTIONS}, got '
                       f'{execution!r}')
    self.cells = list(cells)
    self.trace = trace
    if trace is not None and trace.schedule is None:
      trace.schedule = schedule
    self.schedule = schedule
    self.graph = tick_graph.TickGraph(
        [c.device for c in self.cells], schedule, execution, self._Step,
        lambda step: self.programs[step.stage].Piece(step).num_ops)
    self.m = schedule.num_micro_batches
    self.seed = seed
    self.seeds = []
    for cell in self.cells:
      with tf.device(cell.device):
        self.seeds.append(tf.identity(seed))
    self.programs: list[program_lib.CellProgram] = []
    self.slots: list[slots_lib.Slots] = []
    self.inputs: list = []
    self.labels: list = []
    self.sizes: Any = None
    self.batch: int | None = None
    self.layouts: dict[int, slots_lib.Layout | None] = {}

  # ---- Set-up --------------------------------------------------------------
  def Split(self, flat: Sequence[Any], read_once: bool = False) -> list:
    """Per flat tensor, a TensorArray of its M micro-batches (None stays
    None; a tensor without batch dimension is shared); `read_once` for
    slots a step takes (slots.Take)."""
    if self.sizes is None:
      n = microbatch.BatchSize(flat)
      if isinstance(n, int):
        self.sizes = microbatch.MicroBatchSizes(n, self.m)
        if len(set(self.sizes)) == 1:  # Static shapes run faster.
          self.batch = self.sizes[0]
      else:
        base = n // self.m
        self.sizes = base + tf.cast(tf.range(self.m) < n % self.m, n.dtype)
    return [tl.TensorArrayOf(
        tl.SpecOf(x, None if read_once else self.batch), self.m,
        read_once).split(x, self.sizes) if tl.HasBatch(x) else x
            for x in flat]

  def Build(self, structure: Any, flat: Sequence[Any], training: bool,
            head: Callable[[Sequence[Any]], Any] | None = None,
            labels: Any = None, input_grads: bool = True,
            loss_scale: tf.Tensor | None = None,
            jit_compile: bool = False,
            split: frozenset[int] | None = None) -> None:
    """Splits the inputs (and labels), traces every cell's program in
    forward order and makes every stage's slots.

    Args:
      structure, flat: the first stage's input nest and its flat leaves.
      training: training mode.
      head: with the loss inside, the loss_fn (labels then given).
      labels: any nest split like the inputs, read by the loss.
      input_grads: whether the first stage differentiates its inputs.
      loss_scale: with the loss inside, a float32 scalar the loss is
        multiplied by before it is differentiated (float16 training).
      jit_compile: compile the cells' pieces with XLA.
      split: the stages whose backward the tick programs to run will split
        into B and a later W (ticks.SplitStages); default: every stage the
        schedule gives a W action.
    """
    with tf.device(self.cells[0].device):
      self.inputs = self.Split(flat)
    loss_head = None
    if head is not None:
      if loss_scale is not None:
        labels = (labels, tf.cast(loss_scale, tf.float32))
      label_flat = tf.nest.flatten(labels)
      with tf.device(self.cells[-1].device):
        self.labels = self.Split(label_flat)
      loss_head = program_lib.LossHead(
          head, labels, tuple(tl.SpecOf(x, self.batch) for x in label_flat),
          loss_scale is not None)
    seed_spec = tf.TensorSpec(self.seed.shape, self.seed.dtype)
    last = len(self.cells) - 1
    structs = [structure]
    specs = [[tl.SpecOf(x, self.batch) for x in flat]]
    for cell in self.cells[:-1]:
      struct, out_specs = program_lib.OutputsOf(cell, structs[-1], specs[-1],
                                                seed_spec, training)
      structs.append(struct)
      specs.append(out_specs)
    label_key = None if head is None else (
        head, program_lib.NestKey(labels),
        tuple(map(repr, loss_head.label_specs)))
    programs = [None] * len(self.cells)
    if split is None:
      split = {act.stage for row in self.schedule.actions for act in row
               if act.kind == ticks_lib.W}
    self.split = frozenset(split)
    for s in reversed(range(len(self.cells))):
      cell = self.cells[s]
      dy_present = None
      if training and s < last:
        dy_present = [g is not None for g in programs[s + 1].tensors['dx']]
      key = (program_lib.NestKey(structs[s]),
             tuple(map(repr, specs[s])), training,
             label_key if s == last else None, input_grads or s > 0,
             None if dy_present is None else tuple(dy_present),
             precision.CurrentPolicy(), jit_compile, s in self.split)
      if key not in cell.programs:
        cell.programs[key] = program_lib.CellProgram(
            cell, structs[s], specs[s], seed_spec, training,
            loss_head if s == last else None, input_grads or s > 0,
            dy_present, jit_compile, s in self.split)
      programs[s] = cell.programs[key]
    self.programs = programs
    self.slots = []
    for s, cell in enumerate(self.cells):
      slots, self.layouts[s] = slots_lib.Make(
          self.programs, s, cell.device, self.m, training, head is not None,
          input_grads, self.batch)
      self.slots.append(slots)

  def FeedOutputGradients(self, dys: Sequence[Any]) -> None:
    """Splits the gradients of the merged outputs (one per flat output,
    None where none flows) into the last stage's dy slots (a tape-driven
    backward)."""
    slots = self.slots[-1]
    with tf.device(self.cells[-1].device):
      if any(g is None for ta, g in zip(slots.dy, dys) if ta is not None):
        outputs = self.Outputs()  # Only for the shape of a zero gradient.
        dys = [g if g is not None or ta is None else tf.zeros_like(y)
               for ta, g, y in zip(slots.dy, dys, outputs)]
      dys = [g if ta is not None else None for ta, g in zip(slots.dy, dys)]
      self.slots[-1] = slots._replace(dy=self.Split(dys, read_once=True))

  # ---- Running -------------------------------------------------------------
  def Run(self, program: ticks_lib.TickProgram) -> None:
    """Runs a tick program, updating every stage's slots."""
    unsplit = ticks_lib.SplitStages(program) - self.split
    if unsplit:
      raise ValueError(f'stages {sorted(unsplit)} run a split backward but '
                       'were built unsplit: pass Build the program\'s '
                       'ticks.SplitStages')
    if self.trace is not None:
      for s, cell in enumerate(self.cells):
        with tf.device(cell.device):
          stamps = tuple(tf.TensorArray(tf.float64, size=program.num_ticks,
                                        element_shape=[])
                         for _ in range(2))
        self.slots[s] = self.slots[s]._replace(stamps=stamps)
    self.slots = self.graph.Build(program, self.slots)
    if self.trace is not None:
      self._Record(program)

  def _Record(self, program: ticks_lib.TickProgram) -> None:
    """Hands every action's stamps to the trace (a fused pair's backward
    shares its F's, a joined pair's W its B's)."""
    for row in program.grid:
      for t, act in enumerate(row):
        if act is None:
          continue
        starts, ends = self.slots[act.stage].stamps
        start, end = starts.read(t), ends.read(t)
        for a in program.Runs(act):
          self.trace.Record(a, start, end)

  def _Step(self, step: ticks_lib.Step, m: Any, t: Any,
            mine: slots_lib.Slots) -> tuple[slots_lib.Slots, list]:
    """Runs one step of stage step.stage on micro-batch m: (the stage's new
    slots, the tensors the step made)."""
    s = step.stage
    program = self.programs[s]
    piece = program.Piece(step)
    feeds = {}
    if 'seed' in piece.feeds:
      feeds['seed'] = [random_seeds.FoldIn(self.seeds[s], m)]
    if 'x' in piece.feeds:
      feeds['x'] = slots_lib.Read(self.inputs if s == 0 else mine.x, m)
    if 'labels' in piece.feeds:
      feeds['labels'] = slots_lib.Read(self.labels, m)
    new = {}
    layout = self.layouts[s]
    if 'dy' in piece.feeds:  # Each of these is read by one step: taken.
      feeds['dy'], new['dy'] = slots_lib.Take(mine.dy, m,
                                              program.Specs('dy'))
    for group in ('saved', 'pinned', 'wcut'):
      if group in piece.feeds:
        feeds[group], new[group] = getattr(layout, group).Take(
            getattr(mine, group), m)
    if mine.stamps is not None:
      with tf.control_dependencies(
          [x for g in feeds.values() for x in g if isinstance(x, tf.Tensor)]):
        start = tf.timestamp()
    out = piece(**feeds)
    if 'y' in out:
      if mine.out is not None:
        new['out'] = slots_lib.Write(mine.out, m, out['y'])
      else:
        new['y'] = out['y']
    for group in ('saved', 'pinned', 'wcut'):
      if group in out:
        new[group] = getattr(layout, group).Write(
            new.get(group, getattr(mine, group)), m, out[group])
    if 'bn' in out:
      new['bn'] = layout.bn.Write(mine.bn, 0, [
          a + b for a, b in zip(layout.bn.Read(mine.bn), out['bn'])])
    if 'sums' in out:
      new['sums'] = [a + b for a, b in zip(mine.sums, out['sums'])]
    if 'dx' in out:
      if mine.dx0 is not None:
        new['dx0'] = slots_lib.Write(mine.dx0, m, out['dx'])
      elif s > 0:
        new['dx'] = [None if old is None else g
                     for old, g in zip(mine.dx, out['dx'])]
    if 'dws' in out:
      new['acc'] = layout.acc.Write(mine.acc, 0, [
          None if g is None else (g if prev is None else prev + g)
          for g, prev in zip(out['dws'], layout.acc.Read(mine.acc))])
    made = [x for group in out.values() for x in group if x is not None]
    if mine.stamps is not None:
      with tf.control_dependencies(tick_graph.Finished(made) + [start]):
        end = tf.timestamp()
      new['stamps'] = (mine.stamps[0].write(t, start),
                       mine.stamps[1].write(t, end))
    return mine._replace(**new), made

  # ---- Results -------------------------------------------------------------
  def Outputs(self) -> list:
    """The last stage's outputs, merged over micro-batches (flat)."""
    with tf.device(self.cells[-1].device):
      return [None if ta is None else ta.concat()
              for ta in self.slots[-1].out]

  def InputGradients(self) -> list:
    """The first stage's input gradients, merged (flat; None where none)."""
    with tf.device(self.cells[0].device):
      return [None if ta is None else ta.concat()
              for ta in self.slots[0].dx0]

  def LossSums(self) -> Any:
    """The loss.Sums of the mini-batch."""
    program = self.programs[-1]
    return tf.nest.pack_sequence_as(program.sums_struct, self.slots[-1].sums)

  def Gradients(self) -> dict:
    """{variable.ref(): (variable, gradient)}, summed over micro-batches and
    over the stages that read the variable."""
    grads: dict = {}
    for s, program in enumerate(self.programs):
      with tf.device(self.cells[s].device):
        sums = self.layouts[s].acc.Read(self.slots[s].acc)
      for v, g in zip(program.variables, sums):
        if g is None:
          continue
        if v.ref() in grads:
          with tf.device(v.device):
            g = grads[v.ref()][1] + g
        grads[v.ref()] = (v, g)
    return grads

  def AddBatchNormStats(self, deferred: Any) -> None:
    """Hands every stage's BatchNorm sums to `deferred`
    (normalization.DeferredMovingStats), to move once per step."""
    for s, (program, slots) in enumerate(zip(self.programs, self.slots)):
      if not program.bn_layers:
        continue
      with tf.device(self.cells[s].device):
        bn = self.layouts[s].bn.Read(slots.bn)
      for i, layer in enumerate(program.bn_layers):
        deferred.Add(layer, *bn[3 * i:3 * i + 3])
