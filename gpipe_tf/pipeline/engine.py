"""Builds a pipelined forward and backward pass by following a schedule's clock table.

One call of ``RunPipeline`` builds (in a tf.function) or runs (eagerly) the
micro-batched forward pass of K cells, task by task in the schedule's clock
order. Each task F(k, m) runs under ``tf.device(devices[k])`` and starts only
after the previous task of the same cell (an explicit control dependency: the
dataflow executor would otherwise run tasks in whatever order their inputs
allow, see TF-NOTES), and after F(k-1, m) produced its input (data
dependency). Only the cell-boundary tensors cross devices.

In training the whole pipeline is one ``tf.custom_gradient`` op, so a plain
``tf.GradientTape`` around it yields the pipelined gradients. Its backward
function runs the B(k, m) tasks in the schedule's order, again pinned with
control dependencies and placed on device k, and for a rematerialised
micro-batch first recomputes the cell's forward from its saved boundary input
(inside ``RecomputeScope`` with the same step seed, so dropout masks repeat
and BatchNorm does not update twice). The recomputation of B(k, m) is gated
on B(k, m+1) finishing, so at most one micro-batch's activations per cell are
alive at a time: that is what makes remat save memory inside a tf.function.
Variable gradients of all micro-batches are summed into one gradient per
variable: one synchronous update per mini-batch.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import normalization
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import microbatch
from gpipe_tf.pipeline import schedule as schedule_lib


def _IsFloat(x: Any) -> bool:
  return x is not None and x.dtype.is_floating


def _Gate(tensors: Sequence[Any], after: Sequence[Any]) -> list[Any]:
  """Identities of `tensors` (on the current device) that wait for `after`."""
  after = [a for a in after if a is not None]
  if not after or tf.executing_eagerly():
    return [None if t is None else tf.identity(t) for t in tensors]
  with tf.control_dependencies(after):
    return [None if t is None else tf.identity(t) for t in tensors]


class Cell:
  """One cell: its layers, device, and the structure of its inputs."""

  def __init__(self, index: int, layers: Sequence[base_layer.BaseLayer],
               device: str) -> None:
    self.index = index
    self.layers = list(layers)
    self.device = device
    self.variables = [v for l in self.layers for v in l.trainable_variables]

  def Run(self, structure: Any, flat: Sequence[Any], training: bool) -> tuple:
    xs = tf.nest.pack_sequence_as(structure, list(flat))
    return core.AsTuple(core.RunSequence(self.layers, xs, training))


class PipelineRun:
  """The state of one pipelined call: saved boundary inputs, tapes, outputs."""

  def __init__(self, cells: Sequence[Cell],
               schedule: schedule_lib.Schedule,
               remat: Callable[[int, int], bool], training: bool,
               trace: Any = None) -> None:
    self.cells = list(cells)
    self.trace = trace
    self.schedule = schedule
    self.remat = remat
    self.training = training
    k, m = len(cells), schedule.num_micro_batches
    self.inputs = [[None] * m for _ in range(k)]     # flat inputs of F(k, m)
    self.in_struct = [None] * k
    self.outputs = [[None] * m for _ in range(k)]    # flat outputs of F(k, m)
    self.passed = [[None] * m for _ in range(k)]     # what consumers read
    self.out_struct = [None] * k
    self.tapes = [[None] * m for _ in range(k)]
    self.seeds = [None] * m

  def _Tasks(self, kind: str):
    for clock in self.schedule.clocks():
      for task in clock:
        if task.kind == kind:
          yield task

  def Forward(self, micro_inputs: Sequence[Sequence[Any]], structure: Any,
              seed: tf.Tensor) -> list[list[Any]]:
    """Runs every F(k, m); returns the flat outputs of the last cell per m."""
    self.seeds = [random_seeds.FoldIn(seed, m) for m in range(len(micro_inputs))]
    last_done = [[] for _ in self.cells]
    for task in self._Tasks('F'):
      k, m = task.cell, task.micro_batch
      cell = self.cells[k]
      if k == 0:
        src, struct = micro_inputs[m], structure
      else:
        src, struct = self.passed[k - 1][m], self.out_struct[k - 1]
      with tf.device(cell.device), tf.name_scope(f'cell{k}_fwd_mb{m}'):
        x = _Gate(src, last_done[k])
        if self.trace is not None:
          x = self.trace.Start(task, x)
        self.inputs[k][m], self.in_struct[k] = x, struct
        with random_seeds.StepSeedScope(self.seeds[m]):
          if self.training and not self.remat(k, m):
            tape = tf.GradientTape()
            with tape:
              tape.watch([t for t in x if _IsFloat(t)])
              y = cell.Run(struct, x, self.training)
            self.tapes[k][m] = tape
          else:
            y = cell.Run(struct, x, self.training)
        flat_y = tf.nest.flatten(y)
        self.outputs[k][m], self.out_struct[k] = flat_y, y
        if self.trace is not None:
          flat_y = self.trace.End(task, flat_y)
        self.passed[k][m] = flat_y
        last_done[k] = [t for t in flat_y if t is not None]
    return [self.passed[-1][m] for m in range(len(micro_inputs))]

  def Backward(self, micro_dys: Sequence[Sequence[Any]]
               ) -> tuple[list[list[Any]], dict]:
    """Runs every B(k, m) in schedule order.

    Args:
      micro_dys: per micro-batch, the gradients of the last cell's flat outputs.

    Returns:
      (dx, grads): dx[m] the gradients of the first cell's flat inputs of
      micro-batch m; grads maps variable.ref() to its gradient summed over
      micro-batches (each cell's variables, computed on its device).
    """
    dys = [[None] * len(micro_dys) for _ in self.cells]
    dys[-1] = [list(d) for d in micro_dys]
    dxs = [None] * len(micro_dys)
    acc: dict = {}
    last_done = [[] for _ in self.cells]
    for task in self._Tasks('B'):
      k, m = task.cell, task.micro_batch
      cell = self.cells[k]
      with tf.device(cell.device), tf.name_scope(f'cell{k}_bwd_mb{m}'):
        dy = dys[k][m]
        outs = self.outputs[k][m]
        # Only float outputs that received a gradient take part.
        pairs = [(o, g) for o, g in zip(outs, dy)
                 if _IsFloat(o) and g is not None]
        x = self.inputs[k][m]
        float_idx = [i for i, t in enumerate(x) if _IsFloat(t)]
        if self.remat(k, m) or self.tapes[k][m] is None:
          gate_on = last_done[k] + [g for _, g in pairs]
          x = _Gate(x, gate_on)
          if self.trace is not None:
            x = self.trace.Start(task, x)
          tape = tf.GradientTape()
          with tape:
            tape.watch([x[i] for i in float_idx])
            with base_layer.RecomputeScope(), random_seeds.StepSeedScope(
                self.seeds[m]):
              y = tf.nest.flatten(cell.Run(self.in_struct[k], x,
                                           self.training))
          pairs = [(o, g) for o, g in zip(y, dy)
                   if _IsFloat(o) and g is not None]
        else:
          tape = self.tapes[k][m]
          self.tapes[k][m] = None
          gated = _Gate([g for _, g in pairs], last_done[k])
          if self.trace is not None:
            gated = self.trace.Start(task, gated)
          pairs = [(o, g) for (o, _), g in zip(pairs, gated)]
        sources = [x[i] for i in float_idx] + cell.variables
        if pairs:
          grads = tape.gradient([o for o, _ in pairs], sources,
                                output_gradients=[g for _, g in pairs])
        else:
          grads = [None] * len(sources)
        dx = [None] * len(x)
        for j, i in enumerate(float_idx):
          dx[i] = grads[j]
        done = [g for g in dx if g is not None]
        for v, g in zip(cell.variables, grads[len(float_idx):]):
          if g is None:
            continue
          if isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
          prev = acc.get(v.ref())
          acc[v.ref()] = g if prev is None else prev + g
          done.append(acc[v.ref()])
        if self.trace is not None:
          dx = self.trace.End(task, dx)
          done = [g for g in dx if g is not None] + done
        last_done[k] = done
        if k > 0:
          dys[k - 1][m] = dx
        else:
          dxs[m] = dx
    self.outputs = self.inputs = self.passed = None  # Release references.
    return dxs, acc


def RunPipeline(cells: Sequence[Cell], schedule: schedule_lib.Schedule,
                remat: Callable[[int, int], bool], inputs: tuple,
                training: bool, trace: Any = None) -> Any:
  """Runs `inputs` through the cells in micro-batches; returns merged outputs.

  Args:
    cells: the K cells, cell k on its device.
    schedule: the clock table to follow; every forward of a cell must precede
      its backwards (GPipe), since the loss is computed after the pipeline.
    remat: remat(k, m) is True when F(k, m) is recomputed in the backward pass.
    inputs: the positional inputs of the first layer (any nest of tensors).
    training: training mode (dropout, batch statistics, custom gradient).
    trace: optional trace.ScheduleTrace recording each task's start and end.
  """
  num_micro = schedule.num_micro_batches
  flat = tf.nest.flatten(inputs)
  tensor_idx = [i for i, x in enumerate(flat) if x is not None]
  tensors = [tf.convert_to_tensor(flat[i]) for i in tensor_idx]

  def _Full(ts):
    full = list(flat)
    for i, t in zip(tensor_idx, ts):
      full[i] = t
    return full

  seed = random_seeds.CurrentStepSeed()
  if seed is None:
    seed = random_seeds.NewStepSeed()
  if trace is not None and trace.schedule is None:
    trace.schedule = schedule
  run = PipelineRun(cells, schedule, remat, training, trace)

  if not training:
    micro = microbatch.Split(_Full(tensors), num_micro)
    outs = run.Forward(micro, inputs, seed)
    return core.FromTuple(tf.nest.pack_sequence_as(run.out_struct[-1],
                                                   microbatch.Merge(outs)))

  @tf.custom_gradient
  def _Pipeline(*ts):
    micro = microbatch.Split(_Full(ts), num_micro)
    # BatchNorm: each micro-batch is normalised with its own statistics; the
    # moving statistics move once, from all micro-batches (and replicas).
    with normalization.DeferMovingStats() as bn_stats:
      outs = run.Forward(micro, inputs, seed)
    bn_stats.Apply()
    merged = microbatch.Merge(outs)

    def _Grad(*dys, variables=None):
      micro_dys = microbatch.SplitLike(list(dys), outs)
      dxs, acc = run.Backward(micro_dys)
      input_grads = []
      for j, i in enumerate(tensor_idx):
        parts = [dx[i] for dx in dxs]
        if not _IsFloat(ts[j]) or any(p is None for p in parts):
          input_grads.append(None)
        elif ts[j].shape.rank == 0:
          input_grads.append(tf.add_n(parts))
        else:
          input_grads.append(tf.concat(parts, axis=0) if len(parts) > 1
                             else parts[0])
      var_grads = [acc.get(v.ref()) for v in (variables or [])]
      return input_grads, var_grads

    return merged, _Grad

  merged = _Pipeline(*tensors)
  if not isinstance(merged, (list, tuple)):
    merged = [merged]
  return core.FromTuple(
      tf.nest.pack_sequence_as(run.out_struct[-1], list(merged)))
