"""GPipe's fill-drain schedule as two tf.while_loops over clock ticks (``micro_batch_loop``).

With ``trace_once`` the engine calls each cell's traced function once per
action, so a step's graph still holds a few ops per action: K x M of them.
For the 'gpipe' schedule with one cell per device, where the action order is
fixed by a clock, this module builds the step with a graph that does not grow
with M at all (Lingvo's GPipe loops over micro-batches the same way):

  forward loop, tick t = 0 .. M+K-2: cell k runs F on micro-batch m = t - k
      (when 0 <= m < M), reading cell k-1's output of the previous tick, and
      keeps its boundary input in a TensorArray on its own device; the last
      cell also computes the loss of m and d(loss)/d(outputs) there, or keeps
      its outputs.
  backward loop, tick t = 0 .. M+K-2: cell k runs BW on micro-batch
      m = M-1 - (t - (K-1-k)) (GPipe's order: the last micro-batch first),
      reading cell k+1's input gradient of the previous tick, and calls the
      cell's backward function, which recomputes the forward from the kept
      input and adds the weight gradients to running sums carried by the loop.

Every cell's work in a tick sits in a ``tf.cond`` on its device, so idle
ticks (the bubble) cost nothing but the predicate. The loops carry only the
boundary tensors, the per-device TensorArrays and the sums; each cell's tick
depends on its own previous tick (device order) and on its neighbour's
(dataflow), so cells run concurrently as in the unrolled graph.

Every forward is recomputed in the backward (a loop keeps no activations
between its ticks), BatchNorm statistics and losses are summed in the loop,
and dropout seeds are FoldIn(step seed, m) exactly as in the unrolled engine,
so results equal SequentialLayer's (tests/pipeline/loop_test.py).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.layers import core
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import cell as cell_lib
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import microbatch
from gpipe_tf.pipeline import schedule as schedule_lib


class LoopTraceError(errors.Error, ValueError):
  """A per-action schedule trace was asked of a step run as loops."""


class LoopNeedsLossError(errors.Error, ValueError):
  """FProp was asked of a loop that runs only with the loss inside."""


def Problem(remat: str) -> str | None:
  """Why a step cannot run as loops (None: it can).

  The loops recompute every forward in the backward, so they do not fit
  remat 'never'. Any schedule runs: GPipe with one cell per device as the
  two loops of FillDrainLoop, every other layout as one loop
  (schedule_loop.py).
  """
  if remat == 'never':
    return ("it recomputes every forward in the backward; use remat 'always' "
            "or 'except_last'")
  return None


def RunsTwoLoops(schedule: schedule_lib.Schedule) -> bool:
  """Whether the step runs as FillDrainLoop's two loops: GPipe's own
  order with one cell per device (else as schedule_loop.ScheduleLoop)."""
  k, m = schedule.num_devices, schedule.num_micro_batches
  return (schedule.num_stages == k and
          schedule == schedule_lib.Make('gpipe', k, m))


def FPropProblem(schedule: schedule_lib.Schedule, training: bool
                 ) -> str | None:
  """Why FProp (a tape around the pipeline, or inference) cannot run as
  loops (None: it can): only FillDrainLoop runs without a loss, and in
  training only GPipe's order is GPipe's."""
  if schedule.num_stages != schedule.num_devices:
    return (f'with {schedule.num_stages} cells on {schedule.num_devices} '
            'devices it runs only with the loss inside the pipeline')
  if training and not RunsTwoLoops(schedule):
    return (f"schedule '{schedule.name}' runs as a loop only with the loss "
            'inside the pipeline')
  return None


def Relaxed(x: tf.Tensor) -> tf.Tensor:
  """`x` with its batch dimension unknown: a loop carries micro-batches of
  different sizes (N not divisible by M) in one variable."""
  if x.shape.rank is None or x.shape.rank == 0:
    return x
  return tf.compat.v1.placeholder_with_default(
      x, [None] + x.shape.as_list()[1:])


def Filler(spec: Any) -> tf.Tensor:
  """What a carry holds before the first tick that writes it: zeros of a
  fully known `spec`, else an empty (zero-example) tensor of its rank."""
  shape = spec.shape
  if shape.is_fully_defined():
    return tf.zeros(shape, spec.dtype)
  return Relaxed(tf.zeros([0] + [d or 0 for d in shape.as_list()[1:]],
                           spec.dtype))


def SpecOf(x: Any, batch: int | None) -> tf.TensorSpec | None:
  """`x`'s spec for one micro-batch of `batch` examples (None: any size)."""
  if x is None:
    return None
  shape = x.shape
  if shape.rank:
    shape = tf.TensorShape([batch] + shape.as_list()[1:])
  return tf.TensorSpec(shape, x.dtype)


def HasBatch(x: Any) -> bool:
  """Whether a tensor or TensorSpec has a batch dimension."""
  return x is not None and x.shape.rank is not None and x.shape.rank > 0


def TensorArrayOf(spec: tf.TensorSpec, size: int) -> tf.TensorArray:
  """`size` slots of `spec`, each readable more than once (run eagerly, a
  TensorArray would otherwise clear a slot when it is read)."""
  return tf.TensorArray(spec.dtype, size=size, infer_shape=False,
                        element_shape=spec.shape, clear_after_read=False)


class Compact:
  """A nest's non-None leaves as a flat list, and back: tf.cond and
  tf.while_loop take tensors only, and a None (an input that gets no
  gradient, say) stays None outside them."""

  def __init__(self, nest: Any) -> None:
    self.nest = nest
    self.flat = tf.nest.flatten(nest)
    self.where = [i for i, x in enumerate(self.flat) if x is not None]

  def Values(self, nest: Any = None) -> list:
    """The non-None leaves of `nest` (default: the nest given), in order."""
    flat = self.flat if nest is None else tf.nest.flatten(nest)
    return [flat[i] for i in self.where]

  def Pack(self, values: Sequence[Any]) -> Any:
    full = [None] * len(self.flat)
    for i, x in zip(self.where, values):
      full[i] = x
    return tf.nest.pack_sequence_as(self.nest, full)


def Select(pred: tf.Tensor, run: Callable[[], Any], keep: Any) -> Any:
  """tf.cond(pred, run, lambda: keep), for nests with None leaves."""
  compact = Compact(keep)
  values = tf.cond(pred, lambda: compact.Values(run()), compact.Values)
  for value in values:
    # Run eagerly, a TensorArray a write returns warns unless it is used,
    # and the last tick's writes are only read after the loop.
    getattr(value, 'mark_used', lambda: None)()
  return compact.Pack(values)


class RunningSums:
  """Running sums of many tensors (a cell's weight gradients) carried by a
  loop as one TensorList per dtype instead of one loop variable each.

  Every loop variable costs a few executor ops per tick whether or not the
  tick changes it (the loop's Merge, Switch and NextIteration, and a tf.cond's
  or tf.switch_case's Switch and Merge): with a Transformer cell's 30 or so
  gradients, tens of thousands of small ops per step. A TensorList holds
  references to its tensors, so reading and writing an item copies no data.

  Args:
    zeros: per sum, its zero value, or None for one that is not kept.
  """

  def __init__(self, zeros: Sequence[tf.Tensor | None]) -> None:
    self.zeros = list(zeros)
    self.dtypes: list[tf.DType] = []
    self.where: list[tuple[int, int] | None] = []   # (list, item) per sum
    sizes: list[int] = []
    for z in self.zeros:
      if z is None:
        self.where.append(None)
        continue
      if z.dtype not in self.dtypes:
        self.dtypes.append(z.dtype)
        sizes.append(0)
      i = self.dtypes.index(z.dtype)
      self.where.append((i, sizes[i]))
      sizes[i] += 1
    self.sizes = sizes

  def Initial(self) -> list[tf.Tensor]:
    """The lists holding every sum's zero (built where the caller places
    them)."""
    lists = [tf.raw_ops.TensorListReserve(
        element_shape=tf.constant(-1, tf.int32), num_elements=n,
        element_dtype=dtype) for dtype, n in zip(self.dtypes, self.sizes)]
    return self.Write(lists, self.zeros)

  def Read(self, lists: Sequence[tf.Tensor]) -> list[tf.Tensor | None]:
    """Every sum (None where not kept), with its static shape."""
    return [None if w is None else tf.raw_ops.TensorListGetItem(
        input_handle=lists[w[0]], index=w[1],
        element_shape=tf.constant(z.shape.as_list(), tf.int32),
        element_dtype=z.dtype)
            for w, z in zip(self.where, self.zeros)]

  def Write(self, lists: Sequence[tf.Tensor],
            values: Sequence[tf.Tensor | None]) -> list[tf.Tensor]:
    """`lists` with every kept sum replaced by its value in `values`."""
    lists = list(lists)
    for w, value in zip(self.where, values):
      if w is not None:
        lists[w[0]] = tf.raw_ops.TensorListSetItem(
            input_handle=lists[w[0]], index=w[1], item=value)
    return lists


class FillDrainLoop:
  """One training (or inference) step of GPipe as two loops; see the module.

  Args:
    cells: the K cells, cell k on device k.
    num_micro_batches: M.
    training: training mode.
    seed: the step seed.
  """

  def __init__(self, cells: Sequence[cell_lib.Cell], num_micro_batches: int,
               training: bool, seed: tf.Tensor) -> None:
    self.cells = list(cells)
    self.m = num_micro_batches
    self.training = training
    self.seed = seed
    # A copy of the step seed on every cell's device: read inside a tick's
    # tf.cond, a seed on one device would cross to the others every tick.
    self.seeds = []
    for cell in self.cells:
      with tf.device(cell.device):
        self.seeds.append(tf.identity(seed))
    self.ticks = self.m + len(self.cells) - 1
    # Up to K ticks in flight: every cell can run a tick while the others
    # finish theirs; a boundary output waits for at most K ticks.
    self.overlap = len(self.cells)
    self.in_structs: list[Any] = []
    self.in_specs: list[list] = []     # flat input specs of each cell
    self.bn_zeros: list[list] = []     # per cell: zero BatchNorm sums
    self.out_struct: Any = None
    self.stashes: list[list] = []      # per cell, per flat input: TensorArray
    self.sizes: Any = None             # micro-batch sizes
    self.batch: int | None = None      # their common static size, if any
    self.out_specs: list = []
    self.dys: list = []                # per last-cell output: TensorArray
    self.running: list = []            # per cell: RunningSums of its grads
    self.backward_args: list = []      # per cell: see _BackwardFunctions

  # ---- Inputs --------------------------------------------------------------
  def _SplitInputs(self, flat: Sequence[Any]) -> list:
    """Per flat input: a TensorArray of its M micro-batches (None if None,
    the tensor itself if it has no batch dimension)."""
    n = microbatch.BatchSize(flat)
    if isinstance(n, int):
      self.sizes = microbatch.MicroBatchSizes(n, self.m)
      # Equal micro-batches keep a static shape through the loops (shapes
      # known when the cells are traced run faster than unknown ones).
      if len(set(self.sizes)) == 1:
        self.batch = self.sizes[0]
    else:
      base = n // self.m
      self.sizes = base + tf.cast(tf.range(self.m) < n % self.m, n.dtype)
    out = []
    for x in flat:
      if HasBatch(x):
        out.append(TensorArrayOf(SpecOf(x, self.batch), self.m).split(
            x, self.sizes))
      else:
        out.append(x)
    return out

  def _Trace(self, structure: Any, flat: Sequence[Any]) -> None:
    """Traces every cell's forward on specs, to learn each boundary's
    structure and specs before the loops are built."""
    struct, specs = structure, [SpecOf(x, self.batch) for x in flat]
    seed_spec = tf.TensorSpec(self.seed.shape, self.seed.dtype)
    for cell in self.cells:
      self.in_structs.append(struct)
      self.in_specs.append(specs)
      function, holder = cell.ForwardFunction(struct, self.training,
                                              inline=True)
      concrete = function.get_concrete_function(
          seed_spec, *[s for s in specs])
      flat_y, bn_sums = concrete.structured_outputs
      with tf.device(cell.device):
        self.bn_zeros.append([[tf.zeros(t.shape, t.dtype) for t in stats]
                              for stats in bn_sums])
      struct = holder['struct']
      specs = [None if y is None else tf.TensorSpec(y.shape, y.dtype)
               for y in flat_y]
    self.out_struct = struct
    self.out_specs = specs

  # ---- Forward -------------------------------------------------------------
  def Forward(self, structure: Any, flat: Sequence[Any],
              labels: Any = None, loss_fn: loss_lib.LossFn | None = None,
              bn_stats: Any = None) -> Any:
    """Runs the forward loop.

    Returns the last cell's outputs merged over micro-batches (flat list),
    or, with `loss_fn`, the loss.Sums of the whole mini-batch (then
    `self.dys` holds d(loss sum)/d(outputs) per micro-batch for Backward).
    """
    inputs = self._SplitInputs(flat)
    self._Trace(structure, flat)
    k_last = len(self.cells) - 1
    label_tas = None
    if loss_fn is not None:
      with tf.device(self.cells[-1].device):
        label_flat = tf.nest.flatten(labels)
        label_tas = [TensorArrayOf(SpecOf(x, self.batch), self.m).split(
            x, self.sizes)
                     if HasBatch(x) else x for x in label_flat]
        loss_step, dys0, sums0 = self._LossFunction(labels, label_flat,
                                                    loss_fn)

    carries, stashes, bns = [], [], self.bn_zeros
    for k, cell in enumerate(self.cells):
      with tf.device(cell.device):
        stashes.append([None if s is None else TensorArrayOf(s, self.m)
                        for s in self.in_specs[k]])
        if k < k_last:
          carries.append([None if s is None else Filler(s)
                          for s in self.in_specs[k + 1]])
    with tf.device(self.cells[-1].device):
      if loss_fn is None:
        last = [None if s is None else TensorArrayOf(s, self.m)
                for s in self.out_specs]
      else:
        last = ([None if g is None else TensorArrayOf(s, self.m)
                 for s, g in zip(self.out_specs, dys0)], sums0)

    def _Body(t, carries, stashes, bns, last):
      new_carries, new_stashes, new_bns = list(carries), [], []
      new_last = last
      for k, cell in enumerate(self.cells):
        with tf.device(cell.device):
          m = t - k
          active = tf.logical_and(m >= 0, m < self.m)
          mc = tf.clip_by_value(m, 0, self.m - 1)
          function, _ = cell.ForwardFunction(self.in_structs[k],
                                             self.training, inline=True)
          if k == 0:
            x = [ta.read(mc) if isinstance(ta, tf.TensorArray) else ta
                 for ta in inputs]
          else:
            x = carries[k - 1]

          def _Run(k=k, x=x, mc=mc, function=function):
            seed = random_seeds.FoldIn(self.seeds[k], mc)
            flat_y, sums = function(seed, *[xi for xi in x])
            stash = [None if ta is None else ta.write(mc, xi)
                     for ta, xi in zip(stashes[k], x)]
            bn = [[a + b for a, b in zip(acc, s)]
                  for acc, s in zip(bns[k], sums)]
            if k < k_last:
              out = list(flat_y)
            elif loss_fn is None:
              out = [None if ta is None else ta.write(mc, y)
                     for ta, y in zip(last, flat_y)]
            else:
              label_m = [ta.read(mc) if isinstance(ta, tf.TensorArray)
                         else ta for ta in label_tas]
              dys, sums_m = loss_step(list(flat_y), label_m)
              dy_tas, acc = last
              out = ([None if ta is None else ta.write(mc, g)
                      for ta, g in zip(dy_tas, dys)],
                     tf.nest.map_structure(tf.add, acc, sums_m))
            return out, stash, bn

          keep_out = carries[k] if k < k_last else last
          out, stash, bn = Select(active, _Run,
                                   (keep_out, stashes[k], bns[k]))
          if k < k_last:
            new_carries[k] = out
          else:
            new_last = out
          new_stashes.append(stash)
          new_bns.append(bn)
      return new_carries, new_stashes, new_bns, new_last

    stashes, bns, last = RunTicks(self.ticks, _Body,
                                  (carries, stashes, bns, last),
                                  self.overlap)[1:]
    self.stashes = stashes
    if bn_stats is not None:
      for k, cell in enumerate(self.cells):
        _, holder = cell.ForwardFunction(self.in_structs[k], self.training,
                                         inline=True)
        for layer, stats in zip(holder.get('bn', []), bns[k]):
          bn_stats.Add(layer, *stats)
    with tf.device(self.cells[-1].device):
      if loss_fn is None:
        return [None if ta is None else ta.concat() for ta in last]
      dy_tas, total = last
      self.dys = dy_tas
      return total

  def _LossFunction(self, labels: Any, label_flat: list,
                    loss_fn: loss_lib.LossFn) -> tuple[Callable, Any]:
    """The last cell's loss step (outputs, labels of m) -> (dys, Sums of m),
    the dys of a trace on specs (None where an output gets no gradient) and
    zero Sums of the step's structure."""
    out_struct = self.out_struct

    def _Step(flat_y, label_m):
      floats = [y for y in flat_y if y is not None and y.dtype.is_floating]
      with tf.GradientTape() as tape:
        tape.watch(floats)
        ys = tf.nest.pack_sequence_as(out_struct, list(flat_y))
        terms = loss_fn(core.FromTuple(ys),
                        tf.nest.pack_sequence_as(labels, list(label_m)))
        n = flat_y[0].shape[0] if flat_y and flat_y[0].shape.rank else None
        sums = loss_lib.WeightedSums(terms, n)
      grads = iter(tape.gradient(sums.loss, floats))
      dys = [next(grads) if y is not None and y.dtype.is_floating else None
             for y in flat_y]
      return dys, sums

    function = tf.function(tf.autograph.experimental.do_not_convert(_Step),
                           autograph=False)
    concrete = function.get_concrete_function(
        list(self.out_specs), [SpecOf(x, self.batch) for x in label_flat])
    dys, sums = concrete.structured_outputs
    zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), sums)
    return function, dys, zeros

  # ---- Backward ------------------------------------------------------------
  def _BackwardFunctions(self, present_last: Sequence[bool],
                         input_grads: bool) -> tuple[list, list, list]:
    """Each cell's summing backward function, from the last cell back.

    Args:
      present_last: per output of the last cell, whether it gets a gradient.
      input_grads: whether the first cell's input gradients are wanted.

    Returns:
      (functions, accs, dx_present): per cell, (its backward function, the
      (variable, shape) of each gradient it sums); its zero running sums
      (loop values; self.running[k] reads them, and RunBackward adds to
      them); and per flat input
      whether it gets a gradient (an input the outputs do not depend on
      gets None, and the cell before it then none either).
    """
    k_last = len(self.cells) - 1
    seed_spec = tf.TensorSpec(self.seed.shape, self.seed.dtype)
    wanted_all = [[s is not None and s.dtype.is_floating and
                   (k > 0 or input_grads) for s in specs]
                  for k, specs in enumerate(self.in_specs)]
    # A trace without sums learns the variables and which of them get
    # gradients; the loop then calls one that adds to running sums.
    functions, accs = [None] * len(self.cells), [None] * len(self.cells)
    self.running = [None] * len(self.cells)
    # Per cell: (inputs differentiated, variables), for functions that
    # differentiate the cell like its backward (schedule_loop.py).
    self.backward_args: list = [None] * len(self.cells)
    present, dx_present = present_last, [None] * len(self.cells)
    for k in reversed(range(len(self.cells))):
      cell, specs = self.cells[k], self.in_specs[k]
      out_specs = self.out_specs if k == k_last else self.in_specs[k + 1]
      dy_specs = [s if p else None for p, s in zip(present, out_specs)]
      with tf.device(cell.device):
        plain, holder = cell.BackwardFunction(
            self.in_structs[k], self.training, present, wanted_all[k], None,
            inline=True)
        dx, dws = plain.get_concrete_function(
            seed_spec, list(specs), list(dy_specs), None).structured_outputs
        variables = holder['variables']
        layout = [(v, v.shape) for v, g in zip(variables, dws)
                  if g is not None]
        self.running[k] = RunningSums(
            [None if g is None else tf.zeros(v.shape, v.dtype)
             for v, g in zip(variables, dws)])
        accs[k] = self.running[k].Initial()
        summed, _ = cell.BackwardFunction(
            self.in_structs[k], self.training, present, wanted_all[k],
            [g is not None for g in dws], inline=True)
        functions[k] = (summed, layout)
        self.backward_args[k] = (wanted_all[k], variables)
      dx_present[k] = [g is not None for g in dx]
      present = dx_present[k]
    return functions, accs, dx_present

  def Backward(self, dys: Sequence[Any] | None = None,
               input_grads: bool = False) -> tuple[list, dict]:
    """Runs the backward loop.

    Args:
      dys: gradients of the merged outputs (FProp's custom gradient); None
        after a Forward with a loss (its gradients are used).
      input_grads: whether to return gradients of the first cell's inputs.

    Returns:
      (dx, grads): the input gradients merged over micro-batches (None where
      not asked or not a float) and {variable.ref(): (variable, gradient)}
      summed over micro-batches and cells.
    """
    k_last = len(self.cells) - 1
    with tf.device(self.cells[-1].device):
      if dys is not None:
        dy_tas = [None if g is None else
                  TensorArrayOf(SpecOf(g, self.batch), self.m).split(
                      g, self.sizes)
                  for g in dys]
      else:
        dy_tas = self.dys
    present_last = [ta is not None for ta in dy_tas]
    functions, accs, dx_present = self._BackwardFunctions(present_last,
                                                          input_grads)
    carries = []
    for k in range(1, len(self.cells)):
      with tf.device(self.cells[k].device):
        carries.append([Filler(s) if p else None
                        for s, p in zip(self.in_specs[k], dx_present[k])])
    with tf.device(self.cells[0].device):
      first = [TensorArrayOf(s, self.m) if w and HasBatch(s) else
               (tf.zeros(s.shape, s.dtype) if w else None)
               for s, w in zip(self.in_specs[0], dx_present[0])]

    def _Body(t, carries, accs, first):
      new_carries, new_accs, new_first = list(carries), [], first
      for k, cell in enumerate(self.cells):
        with tf.device(cell.device):
          j = t - (k_last - k)
          active = tf.logical_and(j >= 0, j < self.m)
          mc = tf.clip_by_value(self.m - 1 - j, 0, self.m - 1)
          function, _ = functions[k]
          if k == k_last:
            dy = [None if ta is None else ta.read(mc) for ta in dy_tas]
          else:
            dy = carries[k]   # cell k+1's input gradient, previous tick

          def _Run(k=k, dy=dy, mc=mc, function=function):
            x = [None if ta is None else ta.read(mc) for ta in self.stashes[k]]
            dx, dws = self.RunBackward(k, function, mc, x, list(dy), accs[k])
            if k > 0:
              return list(dx), dws
            out = []
            for slot, g in zip(first, dx):
              if slot is None:
                out.append(None)
              elif isinstance(slot, tf.TensorArray):
                out.append(slot.write(mc, g))
              else:
                out.append(slot + g)
            return out, dws

          keep = carries[k - 1] if k > 0 else first
          out, acc = Select(active, _Run, (keep, accs[k]))
          if k > 0:
            new_carries[k - 1] = out
          else:
            new_first = out
          new_accs.append(acc)
      return new_carries, new_accs, new_first

    accs, first = RunTicks(self.ticks, _Body, (carries, accs, first),
                           self.overlap)[1:]
    grads = self._Gradients(functions, accs)
    with tf.device(self.cells[0].device):
      dx = [slot.concat() if isinstance(slot, tf.TensorArray) else slot
            for slot in first]
    return dx, grads

  def RunBackward(self, k: int, function: Callable, m: tf.Tensor,
                  x: list, dy: list, acc: list) -> tuple[list, list]:
    """Cell k's backward of micro-batch m, from its boundary inputs `x` and
    output gradients `dy`: (its input gradients, the running sums `acc`
    with its weight gradients added)."""
    dx, dws = function(random_seeds.FoldIn(self.seeds[k], m), x, dy,
                       self.running[k].Read(acc))
    return list(dx), self.running[k].Write(acc, dws)

  def _Gradients(self, functions: list, accs: list) -> dict:
    """{variable.ref(): (variable, gradient)} from the loop's running sums,
    summed over cells (a variable two cells read, e.g. a tied embedding)."""
    grads: dict = {}
    for k, (_, layout) in enumerate(functions):
      with tf.device(self.cells[k].device):
        sums = [g for g in self.running[k].Read(accs[k]) if g is not None]
      for (v, _), g in zip(layout, sums):
        if v.ref() in grads:
          with tf.device(v.device):
            g = grads[v.ref()][1] + g
        grads[v.ref()] = (v, g)
    return grads


def RunTicks(ticks: int, body: Callable, state: tuple, overlap: int) -> tuple:
  """state = body(t, *state) for t in range(ticks), as one tf.while_loop
  that runs up to `overlap` ticks at a time.

  None leaves of `state` (an input that gets no gradient, say) stay None
  and are not loop variables.

  Ticks overlap: a cell's tick t+1 starts once its own tick t and its
  neighbour's input are done, not when every cell's tick t is. That takes
  two things. parallel_iterations lets the executor start a tick before the
  last one ends. And the body is built without tf.function's automatic
  control dependencies, which made every output of a tick wait for every
  cell's tf.cond of the tick (they are stateful: they read variables), so a
  tick was a barrier. They order nothing here: a tick writes no state
  (variables are only read, BatchNorm statistics and gradient sums are loop
  values, dropout is stateless). At K=4, M=4 and 8 this took the loop's
  step from 1.1x to about 1.0x the unrolled one's (docs/scale.md).
  """
  compact = Compact(state)

  def _Body(t, *values):
    return [t + 1] + compact.Values(body(t, *compact.Pack(values)))

  graph = tf.compat.v1.get_default_graph()
  with NoAutomaticControlDependencies(graph), graph.device(_BesideInput):
    result = tf.while_loop(lambda t, *_: t < ticks, _Body,
                           [tf.constant(0)] + compact.Values(),
                           maximum_iterations=ticks,
                           parallel_iterations=overlap)
  return compact.Pack(result[1:])


@contextlib.contextmanager
def NoAutomaticControlDependencies(graph: tf.Graph):
  """Loops and conds built in here get no automatic control dependencies.

  while_v2 and cond_v2 build their bodies with them when the graph they are
  built in has them (a tf.function's graph does), reading the graph's
  private ``_add_control_dependencies``; a graph without it is left alone.
  """
  name = '_add_control_dependencies'
  if not hasattr(graph, name):
    yield
    return
  saved = getattr(graph, name)
  setattr(graph, name, False)
  try:
    yield
  finally:
    setattr(graph, name, saved)


def _BesideInput(op: tf.Operation) -> str:
  """Device function for the loops: an Identity no scope placed goes where
  its input is.

  tf.function returns a loop body's outputs through Identity ops it makes
  outside every device scope. The placer would put them all on the first
  device, so every loop variable
  of cells 1..K-1 (the gradient sums above all) crossed devices twice per
  tick: at K=4, M=8, 3,700 Send/Recv pairs per step instead of 1,000, and
  the loop's step 1.5x trace_once's instead of 1.2x (docs/scale.md).
  """
  if op.device:
    return op.device
  if op.type == 'Identity' and op.inputs:
    return op.inputs[0].device
  return ''
