"""Normalisation layers: batch norm with moving statistics, and layer norm."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import tensorflow as tf

from gpipe_tf import hyperparams
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import initializers

__all__ = ['BatchNormLayer', 'CurrentDeferral', 'DeferMovingStats',
           'DeferredMovingStats', 'LayerNorm', 'SumAcrossReplicas']

LayerMeta = base_layer.LayerMeta
Shape = base_layer.Shape


class BatchNormLayer(base_layer.BaseLayer):
  """Batch normalisation over every axis but the last.

  Variables: trainable ``gamma`` (init 1; none with ``scale=False``) and
  ``beta`` (init 0; none with ``center=False``), and non-trainable
  ``moving_mean`` (init 0) and ``moving_variance`` (init 1), all of shape
  [dim].

  FProp in training normalises with the statistics of this batch
  (``ComputeMoments``) and then moves the moving statistics towards them
  (``UpdateMovingStats``)::

    moving <- decay * moving + (1 - decay) * batch_statistic

  The variance is the biased (population) one, for normalising and for the
  moving average alike. (In a pipeline a rematerialisation never runs FProp
  again: it is a prune of the one trace, whose update is an output of the
  forward only, so each batch updates once.) FProp in eval normalises with
  the moving statistics.

  Inside ``DeferMovingStats()`` (the pipeline opens it around the forward
  pass of all micro-batches) the update is deferred: each micro-batch is
  still normalised with its own statistics, but only its sufficient
  statistics (sum, sum of squares, count) are recorded, and the moving
  statistics move once per mini-batch from the statistics of all its
  micro-batches, exactly as a plain BatchNorm over the whole mini-batch would
  (torchgpipe's deferred batch norm).

  Under tf.distribute with several replicas, the sufficient statistics are
  summed across replicas before the update (cross-replica BatchNorm), so the
  moving statistics are those of the global batch. With
  ``cross_replica_normalization`` the training-time normalisation itself also
  uses the statistics of all replicas.

  This layer deliberately does NOT take paddings (mask padded positions out
  of the statistics).

  Under a mixed-precision policy it computes in float32 (KEEP_FLOAT32).
  """

  KEEP_FLOAT32 = True

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('dim', 0, 'Size of the last (channel) dimension.')
    p.Define('decay', 0.999, 'Decay of the moving averages, in [0, 1).')
    p.Define('epsilon', 1e-3, 'Added to the variance before the rsqrt.')
    p.Define('use_moving_avg_in_training', False,
             'If True, training also normalises with the moving statistics '
             '(which are still updated from the batch).')
    p.Define('cross_replica_normalization', False,
             'In training, normalise with the statistics of the batch over '
             'all replicas (all-reduced), not only this replica\'s.')
    p.Define('scale', True, 'Multiply by a learnt gamma (False: by 1).')
    p.Define('center', True, 'Add a learnt beta (False: add 0).')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    p = self.p
    if p.dim <= 0:
      raise base_layer.LayerConfigError(
          f"BatchNormLayer '{self.path}' needs a positive dim, "
          f'got {p.dim}.')
    if not 0.0 <= p.decay < 1.0:
      raise base_layer.LayerConfigError(
          f"BatchNormLayer '{self.path}': decay must be in "
          f'[0, 1), got {p.decay}.')
    if p.epsilon <= 0.0:
      raise base_layer.LayerConfigError(
          f"BatchNormLayer '{self.path}': epsilon must be > 0, "
          f'got {p.epsilon}.')
    if p.scale:
      self.CreateVariable('gamma', [p.dim], init=initializers.Constant(1.0))
    if p.center:
      self.CreateVariable('beta', [p.dim], init=initializers.Constant(0.0))
    self.CreateVariable('moving_mean', [p.dim],
                        init=initializers.Constant(0.0), trainable=False)
    self.CreateVariable('moving_variance', [p.dim],
                        init=initializers.Constant(1.0), trainable=False)

  # ---- Statistics ---------------------------------------------------------
  def _ReduceAxes(self, x: tf.Tensor) -> list[int]:
    if x.shape.rank is None or x.shape.rank < 2:
      raise base_layer.LayerInputError(
          f"layer '{self.path}' (BatchNormLayer) expects an input of rank >= 2"
          f' but got shape {x.shape}')
    return list(range(x.shape.rank - 1))

  def ComputeMoments(self, x: tf.Tensor
                     ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Batch mean and biased variance per channel, and the count behind them.

    Returns:
      (mean [dim], variance [dim], count): count is a float32 scalar, the
      number of elements each channel's statistics were taken over.
    """
    self.CheckLastDim(x, self.p.dim)
    axes = self._ReduceAxes(x)
    mean, variance = tf.nn.moments(x, axes=axes)
    return mean, variance, self._Count(x)

  def SufficientStatistics(self, x: tf.Tensor
                           ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(sum [dim], sum of squares [dim], count): additive over micro-batches."""
    self.CheckLastDim(x, self.p.dim)
    axes = self._ReduceAxes(x)
    return (tf.reduce_sum(x, axis=axes), tf.reduce_sum(tf.square(x), axis=axes),
            self._Count(x))

  @staticmethod
  def MomentsFromSufficientStatistics(total: tf.Tensor, total_sq: tf.Tensor,
                                      count: tf.Tensor
                                      ) -> tuple[tf.Tensor, tf.Tensor]:
    """(mean, biased variance) from accumulated sums and element count."""
    count = tf.cast(count, total.dtype)
    mean = total / count
    variance = tf.maximum(total_sq / count - tf.square(mean), 0.0)
    return mean, variance

  def _Count(self, x: tf.Tensor) -> tf.Tensor:
    return tf.cast(tf.size(x) // self.p.dim, tf.float32)

  def UpdateMovingStats(self, mean: tf.Tensor, variance: tf.Tensor) -> None:
    """Moves the moving statistics towards (mean, variance) by 1 - decay."""
    rate = 1.0 - self.p.decay
    for var, value in ((self.moving_mean, mean),
                       (self.moving_variance, variance)):
      value = tf.stop_gradient(tf.cast(value, var.dtype))
      var.assign_sub((var - value) * rate)

  def _TrainingStatsUpdate(self, x: tf.Tensor, mean: tf.Tensor,
                           variance: tf.Tensor) -> None:
    """The training-time side effect."""
    deferred = _DEFERRED.get()
    if deferred is not None:
      deferred.Add(self, *self.SufficientStatistics(x))
    elif _NumReplicas() > 1:
      total, total_sq, count = SumAcrossReplicas(
          *self.SufficientStatistics(x))
      self.UpdateMovingStats(
          *self.MomentsFromSufficientStatistics(total, total_sq, count))
    else:
      self.UpdateMovingStats(mean, variance)

  # ---- Forward ------------------------------------------------------------
  def FProp(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
    """[..., dim] -> [..., dim]; see the class docstring for training."""
    if not training:
      self.CheckLastDim(x, self.p.dim)
      self._ReduceAxes(x)
      mean, variance = self.moving_mean, self.moving_variance
    else:
      if self.p.cross_replica_normalization and _NumReplicas() > 1:
        total, total_sq, count = SumAcrossReplicas(
            *self.SufficientStatistics(x))
        batch_mean, batch_variance = self.MomentsFromSufficientStatistics(
            total, total_sq, count)
      else:
        batch_mean, batch_variance, _ = self.ComputeMoments(x)
      if self.p.use_moving_avg_in_training:
        # Read before the update: normalise with the statistics so far (in a
        # pipeline, the values its first forward read, recomputations too).
        deferred = _DEFERRED.get()
        if deferred is not None:
          mean, variance = deferred.MovingStats(self)
        else:
          mean = self.moving_mean.read_value()
          variance = self.moving_variance.read_value()
      else:
        mean, variance = batch_mean, batch_variance
      self._TrainingStatsUpdate(x, batch_mean, batch_variance)
    # Variables are float32; a float64 input (a float64 Keras model) is
    # normalised in float64 (casts are no-ops for float32).
    mean, variance, beta, gamma = (None if v is None else tf.cast(v, x.dtype)
                                   for v in (mean, variance,
                                             getattr(self, 'beta', None),
                                             getattr(self, 'gamma', None)))
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma,
                                     self.p.epsilon)

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, shape: Shape) -> LayerMeta:
    base_layer.CheckMetaLastDim(p, shape, p.dim)
    # Statistics (~3 per element) and scale-and-shift (~2 per element).
    flops = 5 * base_layer.NumElements(shape)
    return LayerMeta(flops, (tuple(shape),),
                     (2 + int(p.scale) + int(p.center)) * p.dim)


class LayerNorm(base_layer.BaseLayer):
  """Layer normalisation over the last dimension, with a learnt scale and bias.

  Variables ``scale`` (init 1) and ``bias`` (init 0), shape [input_dim].
  Statistics are computed in float32 whatever the input dtype.

  FProp(x, *passthrough) normalises x and returns any further inputs
  unchanged after it, so the layer can sit in a pipeline whose layers carry
  (x, paddings, ...) tuples.
  """

  SHARE_TRACE = True  # One trace per kind (layers/shared_trace.py).

  KEEP_FLOAT32 = True  # Statistics in float32 under mixed precision.

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Size of the last dimension.')
    p.Define('epsilon', 1e-6, 'Added to the variance before the rsqrt.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams,
               parent_path: str | None = None) -> None:
    super().__init__(params, parent_path)
    if self.p.input_dim <= 0:
      raise base_layer.LayerConfigError(
          f"LayerNorm '{self.path}' needs a positive input_dim, "
          f'got {self.p.input_dim}.')
    self.CreateVariable('scale', [self.p.input_dim],
                        init=initializers.Constant(1.0))
    self.CreateVariable('bias', [self.p.input_dim],
                        init=initializers.Constant(0.0))

  def FProp(self, x: tf.Tensor, *passthrough: Any,
            training: bool = False) -> Any:
    """[..., input_dim] -> [..., input_dim] (then `passthrough`, if any)."""
    self.CheckLastDim(x, self.p.input_dim)
    xf = tf.cast(x, tf.float32)
    mean, variance = tf.nn.moments(xf, axes=[-1], keepdims=True)
    y = (xf - mean) * tf.math.rsqrt(variance + self.p.epsilon)
    y = tf.cast(y, x.dtype) * self.scale + self.bias
    return (y, *passthrough) if passthrough else y

  @classmethod
  def FPropMeta(cls, p: hyperparams.Params, shape: Shape,
                *passthrough_shapes: Shape) -> LayerMeta:
    base_layer.CheckMetaLastDim(p, shape, p.input_dim)
    # Mean, centre, square, mean, rsqrt-multiply, scale, shift.
    flops = 7 * base_layer.NumElements(shape)
    out = (tuple(shape),) + tuple(tuple(s) for s in passthrough_shapes)
    return LayerMeta(flops, out, 2 * p.input_dim)


def _NumReplicas() -> int:
  ctx = tf.distribute.get_replica_context()
  return 1 if ctx is None else int(ctx.num_replicas_in_sync)


def SumAcrossReplicas(*tensors: tf.Tensor) -> list[tf.Tensor]:
  """Sums tensors over all replicas (identity without tf.distribute)."""
  ctx = tf.distribute.get_replica_context()
  if ctx is None or ctx.num_replicas_in_sync == 1:
    return list(tensors)
  return ctx.all_reduce(tf.distribute.ReduceOp.SUM, list(tensors))


class DeferredMovingStats:
  """BatchNorm sufficient statistics of all micro-batches, applied once."""

  def __init__(self) -> None:
    self._layers: list[BatchNormLayer] = []
    self._sums: dict[int, list[tf.Tensor]] = {}
    self._reads: dict[int, tuple[tf.Tensor, tf.Tensor]] = {}

  def MovingStats(self, layer: BatchNormLayer) -> tuple[tf.Tensor, tf.Tensor]:
    """The layer's moving (mean, variance) as first read in this step.

    A rematerialised forward runs after ``Apply`` may have moved them; it must
    normalise with what the original forward used, or its gradients are wrong.
    """
    key = id(layer)
    if key not in self._reads:
      self._reads[key] = (layer.moving_mean.read_value(),
                          layer.moving_variance.read_value())
    return self._reads[key]

  def Add(self, layer: BatchNormLayer, total: tf.Tensor, total_sq: tf.Tensor,
          count: tf.Tensor) -> None:
    key = id(layer)
    if key not in self._sums:
      self._layers.append(layer)
      self._sums[key] = [total, total_sq, count]
    else:
      with tf.device(layer.moving_mean.device):
        self._sums[key] = [a + b for a, b in
                           zip(self._sums[key], (total, total_sq, count))]

  def Export(self) -> tuple[list[BatchNormLayer], list[list[tf.Tensor]]]:
    """(layers, their [total, total_sq, count]) recorded so far."""
    return list(self._layers), [self._sums[id(l)] for l in self._layers]

  def Apply(self, summed_across_replicas: bool = False) -> None:
    """Moves every layer's moving statistics once, from all its micro-batches
    and all replicas (summed here, unless the sums added already were)."""
    for layer in self._layers:
      with tf.device(layer.moving_mean.device):
        total, total_sq, count = self._sums[id(layer)]
        if not summed_across_replicas:
          total, total_sq, count = SumAcrossReplicas(total, total_sq, count)
        layer.UpdateMovingStats(
            *layer.MomentsFromSufficientStatistics(total, total_sq, count))
    self._layers, self._sums = [], {}


_DEFERRED: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_deferred_bn', default=None)


def CurrentDeferral() -> DeferredMovingStats | None:
  """The DeferredMovingStats in scope, or None."""
  return _DEFERRED.get()


@contextlib.contextmanager
def DeferMovingStats(deferred: DeferredMovingStats | None = None
                     ) -> Iterator[DeferredMovingStats]:
  """BatchNorm layers in this scope record statistics instead of updating.

  Call ``Apply()`` on the yielded object after the last micro-batch. Pass an
  existing object to re-enter its scope (a recomputation in the backward).
  """
  deferred = DeferredMovingStats() if deferred is None else deferred
  token = _DEFERRED.set(deferred)
  try:
    yield deferred
  finally:
    _DEFERRED.reset(token)
