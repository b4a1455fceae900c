"""Per-layer costs for the partitioner: FLOPs or parameters from FPropMeta, or measured time."""

from __future__ import annotations

import time
from typing import Sequence

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.layers import aux_losses
from gpipe_tf.layers import core
from gpipe_tf.layers import skips as skips_lib

__all__ = ['COSTS', 'CostEstimateError', 'DEFAULT_PROFILE_BATCH_SIZE',
           'InferInputShapes', 'LayerCosts', 'LayerMetas', 'ProfileBatchSize',
           'ProfileCosts']

COSTS = ('flops', 'params', 'profile')
# Examples per micro-batch cost='profile' times at when nothing says more.
DEFAULT_PROFILE_BATCH_SIZE = 8


class CostEstimateError(errors.Error, ValueError):
  """Layer costs cannot be estimated with the given Params."""


def InferInputShapes(layer_params: Sequence) -> tuple:
  """Input shapes of the first layer when its Params imply them (input_dim)."""
  first = layer_params[0]
  if 'input_dim' in first and first.input_dim:
    return ((None, int(first.input_dim)),)
  raise CostEstimateError(
      f"Cannot infer the input shapes of the first layer '{first.name}' "
      f'({first.cls.__name__}). Set PipeliningLayer Params input_shapes (e.g. '
      "[(None, 224, 224, 3)]), or give an explicit balance, or use "
      "cost='params'.")


def LayerMetas(layer_params: Sequence, input_shapes: Sequence) -> list:
  """FPropMeta of every layer, chaining shapes (no variables are created)."""
  return core.MetaOfSequence(list(layer_params), tuple(input_shapes))


def ProfileBatchSize(input_shapes: Sequence | None,
                     profile_batch_size: int | None,
                     num_micro_batches: int = 1) -> int:
  """The micro-batch size cost='profile' times each layer at (pure Python).

  ``profile_batch_size`` when given; else the largest micro-batch of a
  concrete batch dimension in ``input_shapes`` (N examples cut into M
  micro-batches: ceil(N / M)); else DEFAULT_PROFILE_BATCH_SIZE.

  Raises:
    CostEstimateError: ``profile_batch_size`` is not a positive int.
  """
  if profile_batch_size is not None:
    if (isinstance(profile_batch_size, bool) or
        not isinstance(profile_batch_size, int) or profile_batch_size < 1):
      raise CostEstimateError(
          f'profile_batch_size must be a positive int (examples per '
          f'micro-batch), got {profile_batch_size!r}.')
    return profile_batch_size
  batch = {s[0] for s in input_shapes or () if len(s) and s[0] is not None}
  if len(batch) == 1:
    return max(1, -(-int(batch.pop()) // max(1, num_micro_batches)))
  return DEFAULT_PROFILE_BATCH_SIZE


def ProfileCosts(layer_params: Sequence, input_shapes: Sequence,
                 batch_size: int, repeats: int = 5,
                 min_seconds: float = 0.004) -> list[float]:
  """Seconds of one forward + backward of each layer on a sample micro-batch.

  Like torchgpipe's balance_by_time, every layer is built once on the current
  device, run on a random batch of ``batch_size`` examples (its input is the
  previous layer's output) and thrown away. Unlike a stopwatch around one
  call, the time excludes what a pipeline does not pay per layer:

    * the cost of calling a tf.function (argument handling, the executor's
      start, fetching the results; ~0.1-1 ms on CPU, which would make every
      small layer look as slow as a large one): the forward and backward run
      n times in a sequential loop inside one function, and the time per run
      is the slope (t(1 + r) - t(1)) / r, each t the fastest of ``repeats``
      calls (a busy machine only adds time), r grown until t(1 + r) - t(1)
      >= ``min_seconds``;
    * the loop's own bookkeeping: the slope of the same loop around no layer
      at all (identity) is subtracted.

  Layers with equal Params (but for the name) on equal input shapes are
  timed once and share the cost. A layer that pops a skip is timed on its
  inputs and the popped tensors.

  Returns:
    One cost per layer, in seconds, >= 0.
  """
  shapes = [tuple(batch_size if d is None else d
                  for d in ((batch_size,) + tuple(s[1:]) if len(s) else s))
            for s in input_shapes]
  xs = tuple(tf.random.stateless_normal(s, seed=[1, i])
             for i, s in enumerate(shapes))
  overhead = {}  # Input signature -> seconds of the loop around no layer.
  timed = {}  # (Params text without the name, input signature) -> cost.
  costs = []
  stashed: dict = {}  # Skips (layers/skips.py) on their way to their pop.
  for lp in layer_params:
    xs = skips_lib.Pop(lp, xs, stashed)
    signature = tuple((tuple(x.shape), x.dtype.name) for x in xs)
    layer = lp.Copy().Instantiate(parent_path='_profile')
    with aux_losses.Collect():  # Timed, not trained: its terms are dropped.
      ys = tuple(tf.stop_gradient(y)
                 for y in core.AsTuple(layer.FProp(*xs, training=True)))
    key = (lp.Copy().Set(name='').ToText(), signature)
    if key not in timed:
      if signature not in overhead:
        overhead[signature] = _SecondsPerRun(None, xs, repeats, min_seconds)
      timed[key] = max(0.0, _SecondsPerRun(layer, xs, repeats, min_seconds) -
                       overhead[signature])
    costs.append(timed[key])
    xs = skips_lib.Stash(lp, ys, stashed)
  return costs


def _SecondsPerRun(layer, xs: tuple, repeats: int, min_seconds: float
                   ) -> float:
  """Median seconds of one forward + backward of `layer` (None: identity) on xs."""
  variables = list(layer.trainable_variables) if layer else []

  @tf.function
  def _Loop(n, zero):

    def _Body(i, acc):
      # acc * zero (zero is an argument, not a constant): each run's inputs
      # depend on the previous run, so no run is hoisted out of the loop.
      ins = [x + tf.cast(acc * zero, x.dtype) if x.dtype.is_floating else x
             for x in xs]
      with tf.GradientTape() as tape:
        tape.watch(ins)
        with aux_losses.Collect():  # Timed, not trained.
          ys = (core.AsTuple(layer.FProp(*ins, training=True)) if layer
                else ins)
        loss = tf.add_n([tf.reduce_sum(tf.cast(y, tf.float32)) for y in ys
                         if y.dtype.is_floating] or [tf.constant(0.0)])
      grads = tape.gradient(loss, variables + [x for x in ins
                                               if x.dtype.is_floating])
      # One element of each gradient keeps it computed without reading it
      # all (a sum would add a pass over every weight gradient).
      return i + 1, acc + loss + tf.add_n(
          [tf.cast(tf.reshape(_Dense(g), [-1])[0], tf.float32)
           for g in grads if g is not None] or [tf.constant(0.0)])

    return tf.while_loop(lambda i, acc: i < n, _Body,
                         (tf.constant(0), tf.constant(0.0)),
                         parallel_iterations=1)[1]

  def _Seconds(n):
    start = time.perf_counter()
    _Loop(tf.constant(n), tf.constant(0.0)).numpy()
    return time.perf_counter() - start

  _Seconds(1)  # Trace and warm up.
  r = 4
  while _Seconds(1 + r) - _Seconds(1) < min_seconds and r < 4096:
    r *= 4
  # A busy machine only ever adds time: the fastest of each is the cleanest.
  short, long = zip(*[(_Seconds(1), _Seconds(1 + r)) for _ in range(repeats)])
  return max(0.0, min(long) - min(short)) / r


def _Dense(grad):
  """The values of a sparse gradient (embeddings), else the gradient."""
  return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def LayerCosts(layer_params: Sequence, cost: str,
               input_shapes: Sequence | None,
               profile_batch_size: int | None = None,
               num_micro_batches: int = 1) -> list[float]:
  """The cost of each layer under the named estimator ('flops', 'params', 'profile').

  'profile' times each layer at ProfileBatchSize(input_shapes,
  profile_batch_size, num_micro_batches) examples.
  """
  if cost not in COSTS:
    raise CostEstimateError(f'Unknown cost {cost!r}; use one of {COSTS}.')
  if cost in ('flops', 'profile') and input_shapes is None:
    input_shapes = InferInputShapes(layer_params)
  if cost == 'profile':
    return ProfileCosts(layer_params, input_shapes, ProfileBatchSize(
        input_shapes, profile_batch_size, num_micro_batches))
  if cost == 'params' and input_shapes is None:
    return [float(lp.cls.FPropMeta(lp, *_ParamShapes(lp)).num_params)
            for lp in layer_params]
  metas = LayerMetas(layer_params, input_shapes)
  if cost == 'flops':
    return [float(m.flops) for m in metas]
  return [float(m.num_params) for m in metas]


def _ParamShapes(lp) -> tuple:
  """Shapes that let FPropMeta count parameters when the real ones are unknown."""
  if 'input_dim' in lp and lp.input_dim:
    return ((None, int(lp.input_dim)),)
  raise CostEstimateError(
      f"cost='params' needs PipeliningLayer Params input_shapes to count the "
      f"parameters of layer '{lp.name}' ({lp.cls.__name__}).")
