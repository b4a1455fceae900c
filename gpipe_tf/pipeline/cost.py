"""Per-layer costs for the partitioner: FLOPs or parameters from FPropMeta, or measured time."""

from __future__ import annotations

import time
from typing import Sequence

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.layers import core

COSTS = ('flops', 'params', 'profile')


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


def ProfileCosts(layer_params: Sequence, input_shapes: Sequence,
                 batch_size: int, repeats: int = 3) -> list[float]:
  """Seconds of forward + backward of each layer on a random sample batch.

  Builds every layer once on the current device (like torchgpipe's
  balance_by_time), times it `repeats` times after one warm-up run, keeps the
  fastest, and throws the layers away.
  """
  shapes = [tuple(batch_size if d is None else d for d in s)
            for s in input_shapes]
  xs = tuple(tf.random.stateless_normal(s, seed=[1, i])
             for i, s in enumerate(shapes))
  costs = []
  for i, lp in enumerate(layer_params):
    p = lp.Copy()
    layer = p.Instantiate(parent_path='_profile')

    def _Step(layer=layer, xs=xs):
      with tf.GradientTape() as tape:
        tape.watch([x for x in xs if x.dtype.is_floating])
        ys = core.AsTuple(layer.FProp(*xs, training=True))
        loss = tf.add_n([tf.reduce_sum(tf.cast(y, tf.float32)) for y in ys
                         if y.dtype.is_floating] or [tf.constant(0.0)])
      sources = layer.trainable_variables + tuple(
          x for x in xs if x.dtype.is_floating)
      grads = tape.gradient(loss, sources)
      return ys, [g for g in grads if g is not None]

    step = tf.function(_Step)
    ys, _ = step()
    best = float('inf')
    for _ in range(repeats):
      start = time.perf_counter()
      out = step()
      tf.nest.map_structure(lambda t: t.numpy(), out)
      best = min(best, time.perf_counter() - start)
    costs.append(best)
    xs = tuple(tf.stop_gradient(y) for y in ys)
  return costs


def LayerCosts(layer_params: Sequence, cost: str,
               input_shapes: Sequence | None, profile_batch_size: int = 8
               ) -> list[float]:
  """The cost of each layer under the named estimator ('flops', 'params', 'profile')."""
  if cost not in COSTS:
    raise CostEstimateError(f'Unknown cost {cost!r}; use one of {COSTS}.')
  if cost in ('flops', 'profile') and input_shapes is None:
    input_shapes = InferInputShapes(layer_params)
  if cost == 'profile':
    return ProfileCosts(layer_params, input_shapes, profile_batch_size)
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
