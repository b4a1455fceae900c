"""tf.while_loop plumbing for the pipeline: nests with None leaves, per-micro-batch slots, running sums, the tick loop.

The interpreter (interpreter.py) keeps every stage's per-micro-batch tensors in
TensorArrays and its running sums in TensorLists carried by one
``tf.while_loop`` over clock ticks; this module holds those pieces, which
know nothing of schedules or cells.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import tensorflow as tf

__all__ = ['Compact', 'Filler', 'HasBatch', 'NoAutomaticControlDependencies',
           'RunTicks', 'RunningSums', 'Select', 'SpecOf',
           'TensorArrayOf']


def Filler(spec: Any) -> tf.Tensor:
  """What a carry holds before the first tick that writes it: zeros of a
  fully known `spec`, else an empty (zero-example) tensor of its rank."""
  shape = spec.shape
  if shape.is_fully_defined():
    return tf.zeros(shape, spec.dtype)
  # Any dimension not known statically may vary from tick to tick (a
  # micro-batch's size, a length a layer computes): the carry states none.
  zeros = tf.zeros([0] + [d or 0 for d in shape.as_list()[1:]], spec.dtype)
  return tf.compat.v1.placeholder_with_default(zeros,
                                               [None] * shape.rank)


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


def TensorArrayOf(spec: tf.TensorSpec, size: int,
                  read_once: bool = False) -> tf.TensorArray:
  """`size` slots of `spec`. A slot is readable more than once, unless
  `read_once`: then reading it frees it (activations kept for one
  backward: the memory a schedule bounds is the memory it frees)."""
  return tf.TensorArray(spec.dtype, size=size, infer_shape=False,
                        element_shape=spec.shape,
                        clear_after_read=read_once)


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
