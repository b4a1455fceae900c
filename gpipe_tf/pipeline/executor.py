"""Executes a schedule's actions (F, B, W, BW of stage s on micro-batch m) as TensorFlow ops.

The executor is handed one action at a time, in an order consistent with
every device's action list and the data dependencies (``Schedule.Order()``),
and builds (in a tf.function) or runs (eagerly) that action's ops:

  F(s, m)   the forward of cell s on micro-batch m. A kept micro-batch records
            a tape; a rematerialised one keeps only its boundary input. On the
            last stage, when a loss is given, the loss of micro-batch m and its
            gradient with respect to the outputs are computed right here, on
            the last cell's device.
  BW(s, m)  the whole backward: input gradient and weight gradients.
  B(s, m)   the input-gradient half; the weight-gradient ops it creates are
            held back (control inputs added when W runs) so they run later.
  W(s, m)   the weight-gradient half of an earlier B(s, m).

Every action on device d is pinned after the previous action on d (control
dependencies through ``_Gate``): the dataflow executor would otherwise run
actions in whatever order their inputs allow (docs/tensorflow-notes.md), and
neither the schedule's memory bound nor remat's saving would hold. A
rematerialised backward recomputes the cell's forward from the gated boundary
input with the gated step seed (dropout masks repeat; nothing random is drawn
before the gate) inside ``RecomputeScope`` (BatchNorm does not update twice,
and reads the moving statistics its forward read).

Weight gradients of every micro-batch (and of every cell that reads a shared
variable) are summed per variable; sparse gradients (IndexedSlices, from
embedding lookups) stay sparse until the end.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import tensorflow as tf
from tensorflow.python.eager import record  # pylint: disable=g-direct-tensorflow-import

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import cell as cell_lib
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import schedule as schedule_lib


IsFloat = cell_lib.IsFloat


def _Gate(tensors: Sequence[Any], after: Sequence[Any]) -> list[Any]:
  """Identities of `tensors` (on the current device) that wait for `after`."""
  after = [a for a in after if a is not None]
  if not after or tf.executing_eagerly():
    return list(tensors)
  if len(after) > 1:  # One edge per tensor, not len(after) per tensor.
    with tf.control_dependencies(after):
      after = [tf.no_op(name='after')]
  with tf.control_dependencies(after):
    return [None if t is None else tf.identity(t) for t in tensors]


def _Reachable(tensors: Sequence[Any], within: set) -> set:
  """The ops of `within` that `tensors` depend on (data or control edges)."""
  seen, stack = set(), [t.op for t in tensors if t is not None]
  while stack:
    op = stack.pop()
    if op in seen or op not in within:
      continue
    seen.add(op)
    stack.extend(i.op for i in op.inputs)
    stack.extend(op.control_inputs)
  return seen


class _Deferred:
  """The weight-gradient ops of a B action, held until its W action."""

  def __init__(self, variables, grads, roots) -> None:
    self.variables = variables
    self.grads = grads
    self.roots = roots


class StepExecutor:
  """The state of one pipelined step: boundary tensors, tapes, gradients.

  Args:
    cells: the S cells (stages), cell s on its device.
    schedule: the schedule whose actions are executed.
    remat: remat(s, m) is True when F(s, m) is recomputed in the backward.
    training: training mode (dropout, batch statistics, tapes).
    seed: the step seed; micro-batch m uses FoldIn(seed, m).
    loss_fn: when given, the loss is computed per micro-batch after the last
      stage's forward (see gpipe_tf.pipeline.loss).
    input_grads: whether B/BW of stage 0 computes gradients of the inputs.
    trace: optional trace.ScheduleTrace stamping every action.
    bn_stats: the normalization.DeferredMovingStats of this step; re-entered
      by recomputations so BatchNorm reads what its forward read.
    trace_once: run each cell through its tf.function (Cell.RunTraced),
      traced once and called for every micro-batch, instead of building its
      ops M times.
  """

  def __init__(self, cells: Sequence[cell_lib.Cell],
               schedule: schedule_lib.Schedule,
               remat: Callable[[int, int], bool], training: bool,
               seed: tf.Tensor, loss_fn: loss_lib.LossFn | None = None,
               input_grads: bool = True, trace: Any = None,
               bn_stats: Any = None, trace_once: bool = False) -> None:
    self.cells = list(cells)
    self.schedule = schedule
    self.remat = remat
    self.training = training
    self.loss_fn = loss_fn
    self.input_grads = input_grads
    self.trace = trace
    self.bn_stats = bn_stats
    self.trace_once = trace_once
    s, m = len(cells), schedule.num_micro_batches
    self.seeds = [random_seeds.FoldIn(seed, i) for i in range(m)]
    self.inputs = [[None] * m for _ in range(s)]    # flat inputs of F(s, m)
    self.in_struct: list[Any] = [None] * s
    self.outputs = [[None] * m for _ in range(s)]   # flat outputs of F(s, m)
    self.out_struct: list[Any] = [None] * s
    self.tapes = [[None] * m for _ in range(s)]
    self.dys = [[None] * m for _ in range(s)]       # gradients of outputs
    self.dxs: list[Any] = [None] * m                # gradients of inputs
    self.loss_sums: list[Any] = [None] * m
    self.labels: list[Any] = [None] * m
    self.deferred: dict[tuple[int, int], _Deferred] = {}
    self.device_done: dict[int, list] = {}
    self.grads: dict[Any, Any] = {}                 # var.ref() -> dense sum
    self.sparse: dict[Any, list] = {}               # var.ref() -> slices
    self.variables: dict[Any, tf.Variable] = {}
    # trace_once: stage -> (variables, dense gradient sums) of its backward
    # calls, summed inside them; folded into `grads` by Gradient.
    self.cell_sums: dict[int, tuple[list, list]] = {}

  # ---- Driving -------------------------------------------------------------
  def Run(self, actions: Sequence[schedule_lib.Action],
          micro_inputs: Sequence[Sequence[Any]] | None = None,
          structure: Any = None) -> None:
    """Builds or runs `actions` in order."""
    for action in actions:
      if action.kind == schedule_lib.F:
        self.Forward(action, micro_inputs, structure)
      elif action.kind == schedule_lib.W:
        self.Weight(action)
      else:
        self.Backward(action)

  def _Device(self, stage: int) -> int:
    return self.schedule.DeviceOf(stage)

  def _Stamp(self, edge: str, action, tensors) -> None:
    if self.trace is not None:
      getattr(self.trace, edge)(action, tensors)

  # ---- F -------------------------------------------------------------------
  def Forward(self, action, micro_inputs, structure) -> None:
    s, m = action.stage, action.micro_batch
    cell, d = self.cells[s], self._Device(s)
    if s == 0:
      src, struct = micro_inputs[m], structure
    else:
      src, struct = self.outputs[s - 1][m], self.out_struct[s - 1]
    with tf.device(cell.device), tf.name_scope(f'stage{s}_F_mb{m}'):
      x = _Gate(src, self.device_done.get(d, []))
      self._Stamp('Start', action, x)
      self.inputs[s][m], self.in_struct[s] = x, struct
      if self.training and not self.remat(s, m):
        tape = tf.GradientTape()
        with tape:
          tape.watch([t for t in x if IsFloat(t)])
          y = self._RunCell(cell, struct, x, self.seeds[m])
        self.tapes[s][m] = tape
      elif self.training:
        # Nothing records a rematerialised forward, not even a tape around
        # the whole step: eagerly it would keep every activation alive.
        with record.stop_recording():
          y = self._RunCell(cell, struct, x, self.seeds[m])
      else:
        y = self._RunCell(cell, struct, x, self.seeds[m])
      flat_y = tf.nest.flatten(y)
      self.outputs[s][m], self.out_struct[s] = flat_y, y
      done = [t for t in flat_y if t is not None]
      if self.loss_fn is not None and s == len(self.cells) - 1:
        done += self._Loss(m, y, flat_y)
      self._Stamp('End', action, done)
      self.device_done[d] = done

  def _Loss(self, m: int, y: Any, flat_y: list) -> list:
    """Loss of micro-batch m and d(weighted loss sum)/d(outputs), here."""
    floats = [t for t in flat_y if IsFloat(t)]
    with tf.name_scope('loss'), tf.GradientTape() as tape:
      tape.watch(floats)
      terms = self.loss_fn(core.FromTuple(y), self.labels[m])
      n = flat_y[0].shape[0] if flat_y and flat_y[0].shape.rank else None
      sums = loss_lib.WeightedSums(terms, n)
    grads = iter(tape.gradient(sums.loss, floats))
    self.dys[-1][m] = [next(grads) if IsFloat(t) else None for t in flat_y]
    self.loss_sums[m] = sums
    return [g for g in self.dys[-1][m] if g is not None] + [sums.loss]

  # ---- B and BW ------------------------------------------------------------
  def Backward(self, action) -> None:
    s, m = action.stage, action.micro_batch
    cell, d = self.cells[s], self._Device(s)
    split = action.kind == schedule_lib.B
    dy = self.dys[s][m]
    if dy is None:
      raise schedule_lib.ScheduleError(
          f'{action} runs before the gradient of its outputs exists; the '
          'schedule is not valid (Schedule.Validate names the bad step).')
    with tf.device(cell.device), tf.name_scope(f'stage{s}_{action.kind}_mb{m}'):
      x = self.inputs[s][m]
      before = self.device_done.get(d, [])
      tape = self.tapes[s][m]
      if tape is None and self.trace_once:
        self._BackwardTraced(action, cell, x, dy, before)
        return
      if tape is None:  # Rematerialise from the boundary input.
        gate = before + [g for g in dy if g is not None]
        x = _Gate(x, gate)
        seed = _Gate([self.seeds[m]], gate)[0]
        self._Stamp('Start', action, x)
        tape = tf.GradientTape()
        with tape:
          tape.watch([t for t in x if IsFloat(t)])
          with self._BnScope():
            outs = tf.nest.flatten(self._RunCell(
                cell, self.in_struct[s], x, seed, recompute=True))
      else:
        dy = _Gate(dy, before)
        self._Stamp('Start', action, dy)
        outs = self.outputs[s][m]
      pairs = [(o, g) for o, g in zip(outs, dy) if IsFloat(o) and g is not None]
      float_idx = ([i for i, t in enumerate(x) if IsFloat(t)]
                   if s > 0 or self.input_grads else [])
      variables = self._VariablesRead(cell, tape)
      sources = [x[i] for i in float_idx] + variables
      graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
      first_new = len(graph.get_operations()) if graph is not None else 0
      if pairs:
        grads = tape.gradient([o for o, _ in pairs], sources,
                              output_gradients=[g for _, g in pairs])
      else:
        grads = [None] * len(sources)
      dx = [None] * len(x)
      for j, i in enumerate(float_idx):
        dx[i] = grads[j]
      dws = list(grads[len(float_idx):])
      done = [g for g in dy if g is not None] + [g for g in dx if g is not None]
      if split:
        roots = []
        if graph is not None:
          new_ops = set(graph.get_operations()[first_new:])
          w_ops = (_Reachable(dws, new_ops) -
                   _Reachable([g for g in dx if g is not None], new_ops))
          roots = [op for op in w_ops
                   if not any(i.op in w_ops for i in op.inputs) and
                   not any(c in w_ops for c in op.control_inputs)]
        self.deferred[(s, m)] = _Deferred(variables, dws, roots)
      else:
        done += self._Accumulate(variables, dws)
      self._EndBackward(action, done, dx)

  def _EndBackward(self, action, done: list, dx: list) -> None:
    """Closes a B or BW: its input gradient goes to the stage before."""
    s, m = action.stage, action.micro_batch
    # Its activations are no longer needed (a second gradient of the same
    # step recomputes them from the boundary input, which is kept).
    self.tapes[s][m] = None
    self._Stamp('End', action, done)
    self.device_done[self._Device(s)] = done
    if s > 0:
      self.dys[s - 1][m] = dx
    else:
      self.dxs[m] = dx

  def _BackwardTraced(self, action, cell: cell_lib.Cell, x: list, dy: list,
                      before: list) -> None:
    """A rematerialised B or BW with trace_once: one call of the cell's
    backward function (Cell.BackwardTraced), which recomputes the forward and
    differentiates it inside. Its weight gradients are summed at once, also
    for B (a function's gradient is one op: there is nothing to defer)."""
    s, m = action.stage, action.micro_batch
    gate = before + [g for g in dy if g is not None]
    x = _Gate(x, gate)
    seed = _Gate([self.seeds[m]], gate)[0]
    self._Stamp('Start', action, x)
    wanted = [s > 0 or self.input_grads] * len(x)
    prev = self.cell_sums.get(s)
    with self._BnScope():
      dx, variables, dws = cell.BackwardTraced(
          self.in_struct[s], x, dy, self.training, seed, wanted,
          None if prev is None else prev[1])
    dense = [None if isinstance(g, tf.IndexedSlices) else g for g in dws]
    self.cell_sums[s] = (variables, dense)
    # The call's outputs all exist once it has finished: one of them is
    # enough to order the device's next action after it.
    done = [g for g in dx + dense if g is not None][:1] or [
        g for g in dy if g is not None]
    if action.kind == schedule_lib.B:
      self.deferred[(s, m)] = _Deferred(variables, [], [])
    sparse = [(v, g) for v, g in zip(variables, dws)
              if isinstance(g, tf.IndexedSlices)]
    done += self._Accumulate([v for v, _ in sparse], [g for _, g in sparse])
    self._EndBackward(action, done, dx)

  def _RunCell(self, cell: cell_lib.Cell, struct: Any, x: Sequence[Any],
               seed: tf.Tensor, recompute: bool = False) -> Any:
    """The cell's forward with micro-batch seed `seed` (a recompute: no side
    effects), through the cell's traced function when trace_once."""
    if self.trace_once:
      return cell.RunTraced(struct, x, self.training, seed, recompute)
    scope = base_layer.RecomputeScope() if recompute else (
        contextlib.nullcontext())
    with scope, random_seeds.StepSeedScope(seed):
      return cell.Run(struct, x, self.training)

  def _BnScope(self):
    from gpipe_tf.layers import normalization  # pylint: disable=g-import-not-at-top
    return normalization.DeferMovingStats(self.bn_stats)

  def _VariablesRead(self, cell: cell_lib.Cell, tape) -> list:
    """The cell's variables, then any other trainable variable it read."""
    own = {v.ref() for v in cell.variables}
    shared = [v for v in tape.watched_variables()
              if v.trainable and v.ref() not in own]
    return list(cell.variables) + shared

  # ---- W -------------------------------------------------------------------
  def Weight(self, action) -> None:
    s, m = action.stage, action.micro_batch
    cell, d = self.cells[s], self._Device(s)
    deferred = self.deferred.pop((s, m), None)
    if deferred is None:
      raise schedule_lib.ScheduleError(
          f'{action} runs before B(stage={s}, micro_batch={m}); the schedule '
          'is not valid (Schedule.Validate names the bad step).')
    with tf.device(cell.device), tf.name_scope(f'stage{s}_W_mb{m}'):
      before = [t for t in self.device_done.get(d, []) if t is not None]
      if before and deferred.roots:
        gate = [t.op for t in before]
        for op in deferred.roots:
          op._add_control_inputs(gate)  # pylint: disable=protected-access
      self._Stamp('Start', action, before)
      done = self._Accumulate(deferred.variables, deferred.grads)
      self._Stamp('End', action, done)
      self.device_done[d] = done or before

  # ---- Gradients -----------------------------------------------------------
  def _Accumulate(self, variables: Sequence[tf.Variable],
                  grads: Sequence[Any]) -> list:
    """Adds one action's weight gradients to the running sums."""
    done = []
    for v, g in zip(variables, grads):
      if g is None:
        continue
      self.variables[v.ref()] = v
      if isinstance(g, tf.IndexedSlices):
        self.sparse.setdefault(v.ref(), []).append(g)
        done.append(g.values)
        continue
      prev = self.grads.get(v.ref())
      self.grads[v.ref()] = g if prev is None else prev + g
      done.append(self.grads[v.ref()])
    return done

  def _FoldCellSums(self) -> None:
    """Adds the per-cell sums of trace_once backward calls to `grads`."""
    sums, self.cell_sums = self.cell_sums, {}
    for s in sorted(sums):
      variables, dense = sums[s]
      with tf.device(self.cells[s].device):
        self._Accumulate(variables, dense)

  def ClearGradients(self) -> None:
    """Starts a new backward of the same forward (a persistent tape asking
    again): its gradients are summed afresh."""
    self.grads, self.sparse, self.deferred = {}, {}, {}
    self.cell_sums = {}
    self.dxs = [None] * len(self.dxs)

  def Gradient(self, variable: tf.Variable) -> Any:
    """The summed gradient of `variable` (None if nothing read it)."""
    self._FoldCellSums()
    ref = variable.ref()
    dense, parts = self.grads.get(ref), self.sparse.get(ref, [])
    if not parts:
      return dense
    sparse = parts[0] if len(parts) == 1 else tf.IndexedSlices(
        tf.concat([p.values for p in parts], 0),
        tf.concat([p.indices for p in parts], 0), parts[0].dense_shape)
    if dense is None:
      return sparse
    return dense + tf.convert_to_tensor(sparse)

  def Release(self) -> None:
    """Drops boundary tensors and tapes (eagerly, frees their memory)."""
    self.inputs = self.outputs = self.tapes = self.dys = None
