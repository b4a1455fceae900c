"""A Keras BatchNormalization inside a custom Keras layer, under the pipeline's BatchNorm rules: each micro-batch normalised with its own statistics, the moving statistics moved once per mini-batch.

A top-level Keras BatchNormalization runs as this project's BatchNormLayer
(keras_native). One nested in a custom layer (keras_hub's
``FusedMBConvBlock``, ``DepthwiseConvBlock``, ``HGNetV2Embeddings``,
``SpatialPyramidPooling``) runs as Keras's own layer, which in training
normalises with the batch it is called on (a micro-batch, as
BatchNormLayer does) and assigns its moving statistics at once: once per
micro-batch in a pipeline, not once per mini-batch.

``DeferInnerBatchNorms(layer, training)`` is a scope around one call of a
Keras layer. Inside a pipeline's DeferMovingStats (normalization), each
BatchNormalization under `layer` in training:

  * records the sufficient statistics (sum, sum of squares, count) of its
    input with the deferral, as BatchNormLayer does, under a stand-in
    (``_KerasMovingStats``) that moves its Keras moving variables once per
    step from the pooled statistics of every micro-batch (Keras's rule:
    moving <- momentum * moving + (1 - momentum) * batch, biased variance);
  * runs its own ``call`` inside a ``keras.StatelessScope``, so its
    normalisation is Keras's, and its own assignments of the moving
    statistics are collected by the scope and dropped.

Outside a deferral (a plain SequentialLayer step) the layer runs as Keras
runs it. This module deliberately does NOT take a BatchNormalization with
``renorm=True`` or ``synchronized=True``, or one called with a mask (its
statistics would leave masked positions out): it raises
UnsupportedKerasLayerError.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

import keras
import tensorflow as tf

from gpipe_tf.layers import normalization
from gpipe_tf.layers.keras_errors import UnsupportedKerasLayerError

__all__ = ['CheckInnerBatchNorms', 'DeferInnerBatchNorms', 'InnerBatchNorms']

# One stand-in per Keras BatchNormalization (the deferral keys on identity).
_STANDINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _KerasMovingStats:
  """What DeferredMovingStats needs of a BatchNorm layer, for a Keras one:
  its moving variables, and their update from pooled statistics."""

  MomentsFromSufficientStatistics = staticmethod(
      normalization.BatchNormLayer.MomentsFromSufficientStatistics)

  def __init__(self, bn: keras.layers.BatchNormalization) -> None:
    self.moving_mean = bn.moving_mean.value
    self.moving_variance = bn.moving_variance.value
    self._momentum = float(bn.momentum)

  def UpdateMovingStats(self, mean: tf.Tensor, variance: tf.Tensor) -> None:
    for var, value in ((self.moving_mean, mean),
                       (self.moving_variance, variance)):
      value = tf.stop_gradient(tf.cast(value, var.dtype))
      var.assign(var * self._momentum + value * (1.0 - self._momentum))


def InnerBatchNorms(layer: keras.layers.Layer) -> list:
  """The BatchNormalization layers under `layer` (not `layer` itself)."""
  return [l for l in layer._flatten_layers(include_self=False)  # pylint: disable=protected-access
          if isinstance(l, keras.layers.BatchNormalization)]


def CheckInnerBatchNorms(where: str, layer: keras.layers.Layer) -> None:
  """Raises UnsupportedKerasLayerError for a nested BatchNormalization this
  module cannot defer (module docstring)."""
  for bn in InnerBatchNorms(layer):
    bad = [k for k in ('renorm', 'synchronized') if getattr(bn, k, False)]
    if bad:
      raise UnsupportedKerasLayerError(
          f"{where} holds BatchNormalization '{bn.name}' with "
          f'{bad[0]}=True, whose statistics a pipeline cannot pool over '
          f'micro-batches: set {bad[0]}=False.')


def _Sums(bn: keras.layers.BatchNormalization, x: tf.Tensor
          ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """(sum, sum of squares, count) of `x` over every axis but bn.axis, in
  float32 or wider (as Keras computes BatchNorm)."""
  x = tf.cast(x, tf.float64 if x.dtype == tf.float64 else tf.float32)
  axis = bn.axis % x.shape.rank
  axes = [i for i in range(x.shape.rank) if i != axis]
  count = tf.cast(tf.size(x) // tf.shape(x)[axis], tf.float32)
  return (tf.reduce_sum(x, axis=axes), tf.reduce_sum(tf.square(x), axis=axes),
          count)


def _Deferred(bn: keras.layers.BatchNormalization, call: Any,
              deferred: normalization.DeferredMovingStats) -> Any:
  """`bn`'s call recording its statistics with `deferred` in training."""

  def _Call(inputs, training=None, mask=None):
    if not (training and bn.trainable):
      return call(inputs, training=training, mask=mask)
    if mask is not None:
      raise UnsupportedKerasLayerError(
          f"BatchNormalization '{bn.name}' inside a custom layer is called "
          'with a mask; a pipeline pools unmasked statistics: call it '
          'without one.')
    standin = _STANDINS.get(bn)
    if standin is None:
      standin = _STANDINS[bn] = _KerasMovingStats(bn)
    with tf.device(standin.moving_mean.device):
      deferred.Add(standin, *_Sums(bn, inputs))
    with keras.StatelessScope():  # Keras's own assignments: dropped.
      return call(inputs, training=training, mask=mask)

  return _Call


@contextlib.contextmanager
def DeferInnerBatchNorms(layer: keras.layers.Layer, training: bool
                         ) -> Iterator[None]:
  """Inside, the BatchNormalization layers under `layer` follow the
  pipeline's deferral in scope, if any (module docstring)."""
  deferred = normalization.CurrentDeferral()
  inner = InnerBatchNorms(layer) if training and deferred is not None else []
  for bn in inner:
    bn.call = _Deferred(bn, bn.call, deferred)
  try:
    yield
  finally:
    for bn in inner:
      del bn.call  # The class's own again.
