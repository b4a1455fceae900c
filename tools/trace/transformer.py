"""The stack of Transformer encoder blocks and its training step that tools.trace.cost and tools.trace.first_step build and time.

``Blocks`` gives L identical blocks (width d, 4 heads, hidden 4d) and
``TrainStep`` one SGD step of a model over them as a ``tf.function``: the
mean square of the output of a random batch of ``[n, t, d]`` sequences (no
padding), through ``ComputeLossAndGradients`` for a PipeliningLayer (the
loss inside) or a ``tf.GradientTape`` for a plain SequentialLayer.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ['Blocks', 'InputShapes', 'TrainStep']


def Blocks(num_blocks: int, dim: int) -> list:
  """Params of `num_blocks` Transformer encoder blocks of width `dim`."""
  from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
  return [layers.TransformerEncoderLayer.Params().Set(
      name=f'block{i}', model_dim=dim, hidden_dim=4 * dim, num_heads=4)
          for i in range(num_blocks)]


def InputShapes(dim: int, seq_len: int) -> list:
  """The blocks' input shapes (sequences and paddings; batch None)."""
  return [(None, seq_len, dim), (None, seq_len)]


def TrainStep(net: Any, dim: int, seq_len: int, batch_size: int,
              step_seed: bool = False) -> Callable[[], Any]:
  """One SGD step (learning rate 1e-4) of `net` (a PipeliningLayer, or any
  layer over the blocks trained through a tape), returning the loss.

  Args:
    net: the model.
    dim, seq_len, batch_size: the batch's shape, [batch_size, seq_len, dim].
    step_seed: run the step under a fixed step seed
      (random_seeds.StepSeedScope), as a trainer does.
  """
  import contextlib  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.layers import random_seeds  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import loss as loss_lib  # pylint: disable=g-import-not-at-top

  n, t, d = batch_size, seq_len, dim
  x = tf.random.stateless_normal([n, t, d], [1, 2])
  paddings = tf.zeros([n, t])
  opt = tf.keras.optimizers.SGD(1e-4)
  pipelined = isinstance(net, PipeliningLayer)

  def _LossFn(outputs, _):
    y = outputs[0] if isinstance(outputs, tuple) else outputs
    return loss_lib.LossTerms(tf.reduce_mean(tf.square(y), axis=[1, 2]))

  @tf.function
  def _Step():
    with (random_seeds.StepSeedScope(tf.constant([1, 2], tf.int64))
          if step_seed else contextlib.nullcontext()):
      if pipelined:
        loss, _, grads = net.ComputeLossAndGradients(
            (x, paddings), tf.zeros([n]), _LossFn)
      else:
        with tf.GradientTape() as tape:
          loss = tf.reduce_mean(_LossFn(net.FProp(x, paddings,
                                                  training=True), None).loss)
        grads = tape.gradient(loss, net.trainable_variables)
    opt.apply_gradients(zip(grads, net.trainable_variables))
    return loss

  return _Step
