"""The loss inside the pipeline: per-micro-batch weighted sums that add up to the mini-batch loss.

A schedule that starts micro-batch m's backward before the last forward
(1F1B, interleaved, zero-bubble) needs d(loss)/d(outputs of m) while the other
micro-batches are still in flight, so the loss must be computed per
micro-batch, right after its last forward, on the last cell's device. That only
works for losses that split over examples. The contract of a ``loss_fn``::

    loss_fn(outputs, labels) -> LossTerms(loss, weights, metrics)

where ``outputs`` and ``labels`` are one micro-batch's, ``loss`` holds
per-example (or per-token) losses of shape [n, ...], ``weights`` (same shape,
or None for ones) says how much each counts, and ``metrics`` maps names to
per-example values of the same shape. The mini-batch values are the weighted
means over all micro-batches::

    loss = sum_m sum(loss_m * w_m) / sum_m sum(w_m)

Weights are constants (no gradient flows through them). Since the total
weight is known only after the last micro-batch, the backward of micro-batch m
starts from d(sum(loss_m * w_m)) and the summed gradients are divided by the
total weight at the end: the same gradients as the mean loss, with no
micro-batch waiting for another. Uneven micro-batches need nothing special.

This module deliberately does NOT know about tasks or models; tasks build
their ``loss_fn`` from it.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import tensorflow as tf

from gpipe_tf import errors

__all__ = ['LossFn', 'LossNotSplittableError', 'LossTerms', 'Means',
           'ReduceTerms', 'Sums', 'Total', 'WeightedSums']


class LossNotSplittableError(errors.Error, ValueError):
  """A loss_fn result that cannot be split per micro-batch."""


class LossTerms(NamedTuple):
  """What a pipelined loss_fn returns for one micro-batch.

  Attributes:
    loss: per-example (or per-token) losses, shape [n, ...].
    weights: same shape as ``loss``, or None (every element weighs 1).
    metrics: name -> per-example values of the same shape, averaged with
      ``weights`` like the loss.
  """
  loss: tf.Tensor
  weights: tf.Tensor | None = None
  metrics: dict[str, tf.Tensor] | None = None


LossFn = Callable[[Any, Any], LossTerms]


class Sums(NamedTuple):
  """Weighted sums of one micro-batch (or their total over micro-batches)."""
  loss: tf.Tensor
  weight: tf.Tensor
  metrics: dict[str, tf.Tensor]


def WeightedSums(terms: Any, batch_size: Any = None) -> Sums:
  """Reduces one micro-batch's LossTerms to weighted sums.

  Args:
    terms: what loss_fn returned.
    batch_size: the micro-batch's number of examples (static int or None), to
      check that ``loss`` really is per example.

  Raises:
    LossNotSplittableError: `terms` is not a LossTerms, or its loss is a scalar
      or does not have one entry per example, or weights/metrics disagree with
      the loss's shape.
  """
  if not isinstance(terms, LossTerms):
    raise LossNotSplittableError(
        f'loss_fn returned {type(terms).__name__}; a pipelined loss must return '
        'gpipe_tf.pipeline.loss.LossTerms(loss=<per-example losses [n, ...]>, '
        'weights=..., metrics=...) so that micro-batches can be weighted.')
  loss = tf.convert_to_tensor(terms.loss)
  if loss.shape.rank == 0:
    raise LossNotSplittableError(
        'loss_fn returned a scalar loss; the pipeline needs per-example losses '
        '(shape [n, ...], e.g. the cross-entropy before tf.reduce_mean) to '
        'weight each micro-batch by its share of the mini-batch.')
  if (batch_size is not None and loss.shape.rank is not None and
      loss.shape[0] is not None and int(loss.shape[0]) != int(batch_size)):
    raise LossNotSplittableError(
        f'loss_fn returned losses of shape {loss.shape.as_list()} for a '
        f'micro-batch of {batch_size} examples; dimension 0 must be the '
        'examples.')
  loss = tf.cast(loss, tf.float32)
  if terms.weights is None:
    weights = tf.ones_like(loss)
  else:
    weights = tf.stop_gradient(tf.cast(terms.weights, tf.float32))
    _CheckSameShape('weights', weights, loss)
  metrics = {}
  for name, value in sorted((terms.metrics or {}).items()):
    value = tf.stop_gradient(tf.cast(value, tf.float32))
    _CheckSameShape(f"metric '{name}'", value, loss)
    metrics[name] = tf.reduce_sum(value * weights)
  return Sums(tf.reduce_sum(loss * weights), tf.reduce_sum(weights), metrics)


def _CheckSameShape(what: str, value: tf.Tensor, loss: tf.Tensor) -> None:
  if not value.shape.is_compatible_with(loss.shape):
    raise LossNotSplittableError(
        f'loss_fn {what} has shape {value.shape.as_list()} but the loss has '
        f'{loss.shape.as_list()}; give them the same (per-example) shape.')


def Total(sums: list[Sums]) -> Sums:
  """Adds the sums of several micro-batches."""
  return Sums(tf.add_n([s.loss for s in sums]),
              tf.add_n([s.weight for s in sums]),
              {name: tf.add_n([s.metrics[name] for s in sums])
               for name in sums[0].metrics})


def Means(total: Sums) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
  """(loss, metrics) as weighted means: what the mini-batch loss would be."""
  weight = tf.maximum(total.weight, 1e-12)
  metrics = {name: value / weight for name, value in total.metrics.items()}
  loss = total.loss / weight
  metrics.setdefault('loss', loss)
  return loss, metrics


def ReduceTerms(terms: LossTerms) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
  """(loss, metrics) of a whole batch from its LossTerms (no pipeline)."""
  return Means(WeightedSums(terms))
