"""tf.while_loop plumbing for the pipeline: nests with None leaves, per-micro-batch slots, running sums, the tick loop.

The interpreter (interpreter.py) keeps every stage's per-micro-batch tensors in
TensorArrays or packed TensorLists, and its running sums in packed
TensorLists, carried by the ``tf.while_loop``s over ticks that tick_graph.py
builds (an iteration: one tick, or one period of a repeating stretch); this
module holds those pieces, which know nothing of schedules or cells.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from gpipe_tf.pipeline import leaves
from gpipe_tf.pipeline import tf_internals

__all__ = []  # Internal to the engine: its types are in docs/pipeline.md.


def Filler(spec: Any) -> tf.Tensor:
  """What a carry holds before the first tick that writes it: zeros of a
  fully known `spec`, else an empty (zero-example) tensor of its rank."""
  shape = spec.shape
  if shape.is_fully_defined():
    return tf.zeros(shape, spec.dtype)
  # Any dimension not known statically may vary from tick to tick (a
  # micro-batch's size, a length a layer computes): the carry states none.
  zeros = tf.zeros([0] + [d or 0 for d in shape.as_list()[1:]], spec.dtype)
  return tf_internals.ShapeUnknown(zeros, [None] * shape.rank)


def HoldsMemory(spec: Any) -> bool:
  """Whether a slot of `spec` is emptied once read: not a scalar, which
  holds no memory, unless it is a TensorList (a run's kept tensors)."""
  return bool(spec.shape.rank) or spec.dtype == tf.variant


def Empty(value: tf.Tensor) -> tf.Tensor:
  """A tensor of no examples with `value`'s other dimensions: what a slot
  read once holds after its read, so that the value it held is freed. One
  constant when the other dimensions are known statically (as they mostly
  are): no shape ops to build, optimise or run at every step. A TensorList
  (what a run of layers keeps, layers/shared_run.py) becomes an empty
  one."""
  if value.dtype == tf.variant:
    return tf.raw_ops.EmptyTensorList(
        element_shape=tf.constant(-1), max_num_elements=-1,
        element_dtype=tf.float32)
  dims = value.shape[1:]
  if dims.is_fully_defined():
    return tf_internals.Const(
        np.zeros([0] + dims.as_list(), value.dtype.as_numpy_dtype),
        value.dtype)
  return tf.zeros(tf.concat([[0], tf.shape(value)[1:]], 0), value.dtype)


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

  def Values(self, nest: Any = None) -> list:
    """The leaves of `nest` (default: the nest given) at the given nest's
    non-None places, in order."""
    flat = self.flat if nest is None else tf.nest.flatten(nest)
    return [x for x, t in zip(flat, self.flat) if t is not None]

  def Pack(self, values: Sequence[Any]) -> Any:
    """The given nest with `values` at its non-None places."""
    return tf.nest.pack_sequence_as(self.nest, leaves.Fill(self.flat, values))


def _Flat(x: tf.Tensor) -> tf.Tensor:
  """`x` as a vector: itself where it is one (no reshape op to build and
  run)."""
  return x if x.shape.rank == 1 else tf.reshape(x, [-1])


class Flat:
  """Small tensors as one flat vector per dtype, and back: what a cell's
  pieces add to its sums on every micro-batch (three BatchNorm sums a
  BatchNorm layer, a gradient a variable). As one vector a micro-batch's
  add is one op and its slot one list item, not one of each a tensor: the
  quick start's step built 1,674 TensorList reads and writes and 744 adds
  for its BatchNorm sums alone at K=2, M=4.

  Packing copies the tensors once, so only tensors of at most
  `max_elements` elements are packed (one vector of every gradient made
  steps slower at width 256: docs/tensorflow-notes.md); larger ones, and
  None, follow the vectors as they are. Where a spec's shape is not fully
  known, nothing is packed.

  Args:
    specs: the tensors' TensorSpecs (None for an absent tensor).
    max_elements: the largest tensor packed (None: any size).
  """

  def __init__(self, specs: Sequence[tf.TensorSpec | None],
               max_elements: int | None = None) -> None:
    self.specs = list(specs)
    present = [s for s in self.specs if s is not None]
    packs = all(s.shape.is_fully_defined() for s in present)
    self.packed = [packs and s is not None and (
        max_elements is None or s.shape.num_elements() <= max_elements)
                   for s in self.specs]
    self.dtypes = list(dict.fromkeys(
        s.dtype for s, p in zip(self.specs, self.packed) if p))
    self.groups = [[i for i, s in enumerate(self.specs)
                    if self.packed[i] and s.dtype == d] for d in self.dtypes]

  def Pack(self, values: Sequence[Any]) -> list[Any]:
    """One vector per dtype (its packed tensors' elements in order), then
    the tensors not packed, in order."""
    return ([tf.concat([_Flat(values[i]) for i in group], 0)
             for group in self.groups] +
            [v for v, p in zip(values, self.packed) if not p])

  def Unpack(self, packed: Sequence[Any]) -> list[Any]:
    """The tensors `Pack` made `packed` of, with their shapes."""
    out = [None] * len(self.specs)
    for vector, group in zip(packed, self.groups):
      sizes = [self.specs[i].shape.num_elements() for i in group]
      for i, part in zip(group, tf.split(vector, sizes)):
        # A part of a vector is rank-1 already (most biases and scales).
        out[i] = (part if self.specs[i].shape.rank == 1 else
                  tf.reshape(part, self.specs[i].shape))
    rest = iter(packed[len(self.groups):])
    for i, p in enumerate(self.packed):
      if not p:
        out[i] = next(rest)
    return out


class Packed:
  """Many tensors, each with `size` slots (one per micro-batch), kept as
  one TensorList per dtype instead of one loop variable each: a cell's
  weight-gradient sums and BatchNorm sums (size 1), the activations a kept
  forward stashes for its backward (size M).

  Every loop variable costs a few executor ops per tick whether or not the
  tick changes it (the loop's Merge, Switch and NextIteration, and a
  tf.switch_case's Switch, Merge and an Identity per branch): with a
  Transformer cell's 30 or so gradients and as many stashed activations,
  tens of thousands of small ops per step. A TensorList holds references to
  its tensors, so reading and writing an item copies no data.

  Args:
    specs: per tensor, its TensorSpec, or None for one that is not kept.
    size: slots per tensor.
  """

  def __init__(self, specs: Sequence[Any], size: int = 1) -> None:
    self.specs = list(specs)
    self.size = size
    self.dtypes = list(dict.fromkeys(
        spec.dtype for spec in self.specs if spec is not None))
    self.counts = [0] * len(self.dtypes)   # Tensors per list.
    self.where: list[tuple[int, int] | None] = []   # (list, item) per spec
    for spec in self.specs:
      if spec is None:
        self.where.append(None)
        continue
      i = self.dtypes.index(spec.dtype)
      self.where.append((i, self.counts[i]))
      self.counts[i] += 1

  def Initial(self) -> list[tf.Tensor]:
    """The lists (built where the caller places them), every slot unset."""
    return [tf_internals.ListReserve(dtype, n * self.size)
            for dtype, n in zip(self.dtypes, self.counts)]

  def Zeros(self) -> list[tf.Tensor]:
    """The lists (built where the caller places them) with every slot
    reading as zeros of its spec, none written: an item of a reserved
    TensorList that was never set reads as zeros of the shape its read
    names. Sums start so without a zeros tensor and a write per tensor (a
    cell's weight-gradient sums: two ops a variable to build).

    Raises:
      ValueError: a spec whose shape is not fully defined (its zeros have
        no shape).
    """
    for spec in self.specs:
      if spec is not None and not spec.shape.is_fully_defined():
        raise ValueError(f'Packed.Zeros needs fully defined shapes, got '
                         f'{spec}')
    return self.Initial()

  def _Indices(self, m: Any) -> list:
    """Per tensor, the index of its slot m in its list (None where not
    kept). Where m is a tensor (in a loop), each list's indices are one
    vector unstacked: three ops a list, not an add and a constant a tensor
    (a deep cell stashes hundreds of tensors, and each op made costs
    Python time: 2.9 s of a 64-block ZB-H1 step's trace under cProfile)."""
    if isinstance(m, int):
      return [None if w is None else m * self.counts[w[0]] + w[1]
              for w in self.where]
    per_list = [[m * n] if n == 1 else tf.unstack(
        m * n + tf_internals.Const(np.arange(n), tf.int32), num=n)
                for n in self.counts]
    return [None if w is None else per_list[w[0]][w[1]] for w in self.where]

  def Read(self, lists: Sequence[tf.Tensor], m: Any = 0
           ) -> list[tf.Tensor | None]:
    """Slot m of every tensor (None where not kept), with its static
    shape."""
    return self._Get(lists, self._Indices(m))

  def Write(self, lists: Sequence[tf.Tensor], m: Any,
            values: Sequence[Any]) -> list[tf.Tensor]:
    """`lists` with slot m of every kept tensor set to its value (a None
    value leaves its slot as it was)."""
    return self._Set(lists, self._Indices(m), values)

  def Take(self, lists: Sequence[tf.Tensor], m: Any
           ) -> tuple[list, list[tf.Tensor]]:
    """(slot m of every tensor, the lists with those slots emptied).

    Emptying frees a tensor once its reader is done (why: slots.Take).
    """
    indices = self._Indices(m)
    values = self._Get(lists, indices)
    return values, self._Set(lists, indices, [
        Empty(v) if v is not None and HoldsMemory(v) else None
        for v in values])

  def _Get(self, lists: Sequence[tf.Tensor], indices: Sequence[Any]) -> list:
    return [None if w is None else
            tf_internals.ListGetItem(lists[w[0]], i, spec)
            for w, i, spec in zip(self.where, indices, self.specs)]

  def _Set(self, lists: Sequence[tf.Tensor], indices: Sequence[Any],
           values: Sequence[Any]) -> list[tf.Tensor]:
    lists = list(lists)
    for w, i, value in zip(self.where, indices, values):
      if w is not None and value is not None:
        lists[w[0]] = tf_internals.ListSetItem(lists[w[0]], i, value)
    return lists


def RunTicks(ticks: int, body: Callable, state: tuple, overlap: int) -> tuple:
  """state = body(t, *state) for t in range(ticks), as one tf.while_loop
  that runs up to `overlap` iterations at a time (an iteration is a tick,
  or a period of ticks: tick_graph.py).

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
  values, dropout is stateless).
  """
  compact = Compact(state)

  def _Body(t, *values):
    return [t + 1] + compact.Values(body(t, *compact.Pack(values)))

  graph = tf.compat.v1.get_default_graph()
  with tf_internals.NoAutomaticControlDependencies(graph), graph.device(_BesideInput):
    return compact.Pack(tf.while_loop(
        lambda t, *_: t < ticks, _Body,
        [tf.constant(0)] + [_Entering(x) for x in compact.Values()],
        maximum_iterations=ticks, parallel_iterations=overlap)[1:])


def _Entering(x: Any) -> Any:
  """`x` as it enters a loop: an op of its own on x's device, with no
  dimension known if some is not.

  The placer puts a loop variable's Enter, Merge, Switch, NextIteration and
  Exit beside the op that makes its initial value, but not beside a
  function call's output (a step's piece): those went to the first device,
  so a tensor a stage of another device made (its y, its dx) crossed to
  the first device and back at every iteration. And a loop variable must
  enter with a shape no more specific than any tick gives it: steps built
  before the loop (with micro-batches of several sizes) can give it one
  more specific than a step in the loop does.
  """
  if not isinstance(x, tf.Tensor):
    return x
  partial = (x.dtype != tf.variant and bool(x.shape.rank) and
             not x.shape.is_fully_defined())
  if not x.device and not partial:
    # Placed nowhere: an output of an earlier loop, whose Exit is beside its
    # Enter. An op of its own here would go to the default device (in a
    # process per device, the chief's), and the variable with it.
    return x
  with tf.device(x.device):
    if partial:
      return tf_internals.ShapeUnknown(x, [None] * x.shape.rank)
    return tf.identity(x)


def _BesideInput(op: tf.Operation) -> str:
  """Device function for the loops: an Identity no scope placed goes where
  its input is.

  tf.function returns a loop body's outputs through Identity ops it makes
  outside every device scope. The placer would put them all on the first
  device, so every loop variable of cells 1..K-1 (the gradient sums above
  all) would cross devices twice per tick.
  """
  if op.device:
    return op.device
  if op.type == 'Identity' and op.inputs:
    return op.inputs[0].device
  return ''
