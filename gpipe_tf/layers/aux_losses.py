"""Auxiliary losses: terms a layer adds to the training loss (a MoE router's load-balancing loss), collected where the loss is made.

A layer adds one in training with ``Add(value)`` (a Params layer calls
``BaseLayer.AddAuxLoss``, as Lingvo's layers add an aux_loss; a KerasLayer
adds what its Keras layer gave ``add_loss``). The code that computes the loss
opens ``Collect()`` around the forward and adds ``Total()`` to the loss it
differentiates::

    with aux_losses.Collect() as aux:
      outputs = model.FProp(x, training=True)
    loss = loss_fn(outputs) + aux.Total()   # Total() is 0.0 if none was added

The tasks (``BaseTask.ComputeLoss``), ``PipelineModel`` and a pipeline's
cell programs do this: a pipeline collects each cell's terms per micro-batch
and adds them to its loss (cell_program; the semantics are docs/keras.md's).
A term added with no ``Collect()`` in scope raises AuxLossNotCollectedError:
it would otherwise be left out of the loss, and the model would train
otherwise than it says.

This module deliberately does NOT scale, average or weight terms: that is
the loss's business (the pipeline weighs each micro-batch's terms).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import tensorflow as tf

from gpipe_tf import errors

__all__ = ['AuxLossNotCollectedError', 'Add', 'Collect', 'Collected']


class AuxLossNotCollectedError(errors.Error, ValueError):
  """A layer added an auxiliary loss where no loss collects it."""


class Collected:
  """The auxiliary loss terms added in one ``Collect()`` scope."""

  def __init__(self) -> None:
    self.terms: list[tf.Tensor] = []

  def Total(self) -> tf.Tensor:
    """The sum of the terms as a float32 scalar (0.0 if there are none)."""
    if not self.terms:
      return tf.constant(0.0)
    return tf.add_n(self.terms)


_SCOPE: contextvars.ContextVar = contextvars.ContextVar(
    'gpipe_tf_aux_losses', default=None)


@contextlib.contextmanager
def Collect() -> Iterator[Collected]:
  """Terms added inside go to the yielded Collected (an inner scope takes
  them from an outer one)."""
  collected = Collected()
  token = _SCOPE.set(collected)
  try:
    yield collected
  finally:
    _SCOPE.reset(token)


def Add(value: Any, where: str = 'a layer') -> None:
  """Adds `value` (summed to a float32 scalar) to the loss in scope.

  Args:
    value: a tensor; all its elements are summed.
    where: who adds it, for the error.

  Raises:
    AuxLossNotCollectedError: no ``Collect()`` is in scope.
  """
  collected = _SCOPE.get()
  if collected is None:
    raise AuxLossNotCollectedError(
        f'{where} adds an auxiliary loss in training (add_loss, AddAuxLoss) '
        'but nothing collects it, so it would be left out of the loss. '
        'Train through a task, PipelineModel or PipeliningLayer.'
        'ComputeLossAndGradients, or run the forward inside '
        'gpipe_tf.layers.aux_losses.Collect() and add its Total() to your '
        'loss.')
  collected.terms.append(
      tf.reduce_sum(tf.cast(tf.convert_to_tensor(value), tf.float32)))
