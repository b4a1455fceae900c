"""The chief of pipeline_cluster_replicas_test: 2 replicas x 2 cells on remote workers, driven in-graph.

Run as ``python tests/runtime/pipeline_cluster_replicas_client.py CLUSTER_JSON
OUT_DIR`` from the repository root, with 2 workers of 2 devices each.
Connects (before any op), lays 2 replicas x 2 cells over the workers
(``pipeline_cluster.ReplicaPipelineDevices``) and makes the in-graph
MirroredStrategy (``distribute.ReplicaLayout.OnCluster(...).MakeStrategy``).
Then:

1. The 4-layer FC pipeline of pipeline_cluster_client (K=2, M=2, replica 0
   on ``devices``): one step's loss and gradients, each replica on its
   share of the global batch (``distribute.ReplicaInput``), averaged with
   ``distribute.BatchedAllReduce`` as the training loop does. Writes
   OUT_DIR/results.npz (every replica's reduced and own loss and gradients)
   and OUT_DIR/placement.json (the devices of the cells, of each
   replica's gradients and of every variable's mirrored copies). Adds 1 to
   every variable and writes OUT_DIR/ckpt from this process only.
2. ``loop.train`` of BATCH_NORM_EXPERIMENT (Tiny without dropout, a
   BatchNorm first, as a 2-cell pipeline) for TRAIN_STEPS steps in
   OUT_DIR/bn with the strategy: Adam, cross-replica BatchNorm, checkpoints.

The test imports this file for its Params and computes the same in one
process without a cluster.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

from gpipe_tf import pipeline
from gpipe_tf.layers import normalization
from gpipe_tf.runtime import distribute
from gpipe_tf.runtime import pipeline_cluster
from gpipe_tf.train import loop
from params.synthetic import mlp
import pipeline_cluster_client as fc  # pylint: disable=g-bad-import-order

NUM_REPLICAS = 2
NUM_CELLS = 2
TRAIN_STEPS = 2


class PlainBatchNorm(mlp.Tiny):
  """Tiny without dropout, a BatchNorm (decay 0) first: one device."""

  def Task(self):
    p = super().Task()
    layers = [l for l in p.model.layers if l.name != 'dropout']
    layers.insert(0, normalization.BatchNormLayer.Params().Set(
        name='bn', dim=self.INPUT_DIM, decay=0.0))
    p.model.layers = layers
    return p


def PipedBatchNorm(devices=None, num_micro_batches=2):
  """PlainBatchNorm's layers as a 2-cell pipeline.

  Each micro-batch is normalised with its own statistics, so R replicas of
  M micro-batches compute what one replica of R x M micro-batches does (the
  same micro-batches), not what the unpipelined PlainBatchNorm does.
  """

  class _Piped(PlainBatchNorm):

    def Task(self):
      p = super().Task()
      p.model = pipeline.PipeliningLayer.Params().Set(
          name=p.model.name, layers=p.model.layers, num_partitions=NUM_CELLS,
          num_micro_batches=num_micro_batches, remat='always',
          devices=devices,
          input_shapes=[(None, self.INPUT_DIM)])
      return p

  return _Piped


def Weights():
  """Per-row weights of the FC loss: a dropped or permuted row shows."""
  return tf.range(1, fc.BATCH + 1, dtype=tf.float32)[:, None]


def _FcStep(strategy, model, devices_of_grads):
  """Traces and runs one step; records each replica's gradient devices."""
  variables = list(model.trainable_variables)

  def _Replica(x, target, w):
    x, target, w = distribute.ReplicaInput((x, target, w))
    with tf.GradientTape() as tape:
      y = model.FProp(x, training=True)
      loss = tf.reduce_mean(tf.square(y - target) * w)
    grads = tape.gradient(loss, variables)
    devices_of_grads[distribute.ReplicaId()] = [g.device for g in grads]
    own = (loss, grads)
    loss, grads = distribute.BatchedAllReduce(tf.distribute.ReduceOp.MEAN,
                                              (loss, grads))
    return loss, grads, own

  @tf.function
  def _Step(x, target, w):
    return strategy.run(_Replica, (x, target, w))

  x, target = fc.Inputs()
  return variables, _Step(x, target, Weights())


def main(cluster_json: str, out_dir: str) -> None:
  cluster = pipeline_cluster.ParseCluster(cluster_json)
  pipeline_cluster.ConnectToCluster(cluster, timeout_seconds=60)
  rows = pipeline_cluster.ReplicaPipelineDevices(NUM_REPLICAS, NUM_CELLS,
                                                 cluster)
  layout = distribute.ReplicaLayout.OnCluster(rows, cluster.client_device)
  strategy = layout.MakeStrategy()

  with strategy.scope():
    model = fc.Model(NUM_CELLS, 2, rows[0])
  own_gradients = {}
  variables, (loss, grads, own) = _FcStep(strategy, model, own_gradients)
  local = strategy.experimental_local_results
  results, placement = {}, {'rows': rows, 'own_gradients': own_gradients,
                            'variables': {}}
  for r in range(NUM_REPLICAS):
    results[f'{r}/loss'] = local(loss)[r].numpy()
    results[f'{r}/own_loss'] = local(own[0])[r].numpy()
    for v, g, g_own in zip(variables, grads, own[1]):
      results[f'{r}/{v.name}'] = local(g)[r].numpy()
      results[f'{r}/own/{v.name}'] = local(g_own)[r].numpy()
  for v in variables:
    placement['variables'][v.name] = [c.device for c in v.values]
    v.assign(v + 1.0)  # Every mirrored copy; the test reads the last one.
    results[f'plus_one/{v.name}'] = v.values[-1].numpy()
  tf.train.Checkpoint(model=model).write(
      os.path.join(out_dir, 'ckpt'), options=tf.train.CheckpointOptions(
          experimental_io_device=cluster.client_device))
  np.savez(os.path.join(out_dir, 'results.npz'), **results)
  with open(os.path.join(out_dir, 'placement.json'), 'w') as f:
    json.dump(placement, f)

  loop.train(PipedBatchNorm(rows[0]), os.path.join(out_dir, 'bn'),
             TRAIN_STEPS, save_interval_steps=TRAIN_STEPS, strategy=strategy,
             checkpoint_io_device=cluster.client_device)


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2])
