"""Carries a micro-batch's auxiliary losses (aux_losses) from cell to cell, so that each cell's backward differentiates its own terms.

A cell's layers add auxiliary losses (a MoE router's load-balancing loss) in
its forward. They cannot wait for the last cell: each term's gradient must
enter the backward of the cell that made it. So a cell whose micro-batch
has terms so far passes them on beside its outputs, as one more boundary
tensor, the *carrier*: ``aux`` of shape [n] (n the micro-batch's examples),
whose sum is the micro-batch's terms so far. The stage that ends the chain
reads the sum, and the gradient it gives the carrier flows back through
every cell's carrier to each cell's own terms::

    cell 0:  carrier = a0 / n                 (spread over its n examples)
    cell 1:  carrier = carrier + a1 / n
    last:    aux = sum(carrier) + a2          loss sums += weight_m * aux

With the loss inside ('loss'), micro-batch m's loss sums get
``weight_m * aux_m`` (weight_m its loss weight, loss.Sums.weight), so the
reported loss and the gradients are those of::

    sum_m sum(loss_m * w_m) / sum_m weight_m  +  sum_m (weight_m / W) aux_m

(each micro-batch's terms weigh what its examples weigh in the loss; at M=1
exactly Keras's loss + sum(model.losses)). Without the loss inside (the
tape path, 'merge'), the last cell returns ``weight_m = n_m`` copies as an
output (each example carries its micro-batch's aux), which the pipeline sums
and divides by the batch (``MergedAux``): ``sum_m (n_m / N) aux_m``.

In inference nothing is carried. This module deliberately does NOT decide
what a term means: layers add terms (aux_losses.Add), the loss weighs them.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import tensorflow as tf

from gpipe_tf.layers import aux_losses

__all__ = []  # Internal to the engine.

# Where the chain of carriers ends: 'pass' (a cell before the last), 'loss'
# (the last, with the loss inside), 'merge' (the last, the loss outside).
PASS, LOSS, MERGE = 'pass', 'loss', 'merge'


class Carried(NamedTuple):
  """A cell's outputs and its micro-batch's carrier ([n] float32); the
  carrier is the last flat leaf."""
  outputs: Any
  aux: tf.Tensor


def _Examples(flat: Sequence[Any]) -> Any:
  """The micro-batch's examples: the first dimension of its first batched
  tensor (a Python int when static)."""
  for x in flat:
    if isinstance(x, tf.Tensor) and x.shape.rank:
      n = x.shape[0]
      return int(n) if n is not None else tf.shape(x)[0]
  raise ValueError('a cell with auxiliary losses has no batched input')


def Run(forward: Callable[[Any, list], tuple], structure: Any,
        flat: Sequence[Any], training: bool, end: str
        ) -> tuple[Any, tuple, tf.Tensor | None]:
  """Runs a cell's `forward(structure, flat) -> (outputs, skips)`,
  collecting its auxiliary losses and carrying them on.

  Args:
    forward: the cell's forward on its inputs (without a carrier).
    structure: the inputs' nest; a Carried when an earlier cell carries.
    flat: the flat inputs (the carrier last when `structure` is Carried).
    training: training mode (inference carries nothing).
    end: PASS, LOSS or MERGE (module docstring).

  Returns:
    (outputs, skips, aux): with PASS or MERGE the outputs are a Carried when
    anything is carried; with LOSS, aux is the micro-batch's terms (a float32
    scalar), else None.
  """
  carried_in = None
  if isinstance(structure, Carried):
    structure, carried_in = structure.outputs, flat[-1]
    flat = flat[:-1]
  with aux_losses.Collect() as collected:
    y, skips = forward(structure, list(flat))
  if not training or (carried_in is None and not collected.terms):
    return y, skips, None
  own = collected.Total()
  if end == LOSS:
    total = own if carried_in is None else tf.reduce_sum(carried_in) + own
    return y, skips, total
  n = (_Examples(flat) if carried_in is None else
       carried_in.shape[0] or tf.shape(carried_in)[0])
  if end == MERGE:
    total = own if carried_in is None else tf.reduce_sum(carried_in) + own
    return Carried(y, tf.fill([n], total)), skips, None
  spread = own / tf.cast(n, tf.float32)
  carrier = (tf.fill([n], spread) if carried_in is None else
             carried_in + spread)
  return Carried(y, carrier), skips, None


def MergedAux(flat_outputs: Sequence[Any]) -> tf.Tensor:
  """The batch's auxiliary loss from the last cell's merged carrier (MERGE):
  its mean over the batch."""
  carrier = flat_outputs[-1]
  return tf.reduce_sum(carrier) / tf.cast(tf.shape(carrier)[0], tf.float32)
