"""Counts the ops of built training steps, per schedule and remat policy: a refactor of the engine that must not change its graphs compares these counts before and after.

Each row builds one training step of a small model (FC layers, a BatchNorm and
a skip that crosses cells, K=2 logical devices, M=4) as a ``tf.function``
and counts the ops of its traced graph and of every function in that graph's
library (the pruned cell pieces and the loops' bodies)::

    python -m tools.trace.step_ops             # the working tree's engine
    cd /tmp/old && python -m tools.step_ops    # a checkout from before tools/trace/

Rows: gpipe, 1f1b, interleaved_1f1b (V=2), zb_h1 and zbv trained with the loss
inside (ComputeLossAndGradients), and gpipe trained through a tape (FProp),
each with remat 'always' and 'never'. Equal counts mean the same ops were
built, not that they run in the same order; the tests check that.
"""

from __future__ import annotations

import os
from typing import Sequence

from absl import app

__all__ = ['CountOps', 'ROWS']

# (schedule, V, path): path 'loss' is ComputeLossAndGradients, 'tape' FProp
# under a GradientTape.
ROWS = (('gpipe', 1, 'loss'), ('gpipe', 1, 'tape'), ('1f1b', 1, 'loss'),
        ('interleaved_1f1b', 2, 'loss'), ('zb_h1', 1, 'loss'),
        ('zbv', 2, 'loss'))
REMATS = ('always', 'never')


def _Layers() -> list:
  from gpipe_tf.layers import core  # pylint: disable=g-import-not-at-top
  from gpipe_tf.layers import normalization  # pylint: disable=g-import-not-at-top

  def _Fc(name, din, dout):
    return core.FCLayer.Params().Set(name=name, input_dim=din,
                                     output_dim=dout, activation='TANH')

  return [_Fc('fc0', 6, 8), core.BranchLayer.Params().Set(
      name='b', stash=('s',)), _Fc('fc1', 8, 8),
          normalization.BatchNormLayer.Params().Set(name='bn', dim=8),
          _Fc('fc2', 8, 8), _Fc('fc3', 8, 8),
          core.MergeLayer.Params().Set(name='m', pop=('s',)),
          _Fc('fc4', 8, 5)]


def CountOps(schedule: str, v: int, path: str, remat: str,
             k: int = 2, m: int = 4) -> tuple[int, int]:
  """(ops of the step's graph, ops of the functions in its library) of one
  training step of `schedule`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import loss as loss_lib  # pylint: disable=g-import-not-at-top

  pipe = PipeliningLayer.Params().Set(
      name='net', layers=_Layers(), num_partitions=k, num_micro_batches=m,
      schedule=schedule, num_virtual_stages=v, remat=remat,
      input_shapes=[(None, 6)]).Instantiate()
  x = tf.random.stateless_normal([8, 6], [1, 2])
  labels = tf.zeros([8], tf.int32)

  def _LossFn(logits, y):
    del y
    return loss_lib.LossTerms(tf.reduce_sum(tf.square(logits), axis=1))

  @tf.function
  def _Step():
    if path == 'loss':
      return pipe.ComputeLossAndGradients(x, labels, _LossFn)[2]
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(pipe.FProp(x, training=True)))
    return tape.gradient(loss, pipe.trainable_variables)

  graph = _Step.get_concrete_function().graph
  library = graph.as_graph_def().library
  return (len(graph.get_operations()),
          sum(len(f.node_def) for f in library.function))


def main(argv: Sequence[str]) -> None:
  del argv
  os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
  from gpipe_tf.runtime import devices  # pylint: disable=g-import-not-at-top
  devices.SplitCpu(4)
  print('| schedule | V | path | remat | graph ops | library ops |')
  print('|---|---|---|---|---|---|')
  for schedule, v, path in ROWS:
    for remat in REMATS:
      ops, lib = CountOps(schedule, v, path, remat)
      print(f'| {schedule} | {v} | {path} | {remat} | {ops} | {lib} |',
            flush=True)


if __name__ == '__main__':
  app.run(main)
