"""The chief of pipeline_cluster_test: pipelined loss and gradients with the cells on remote workers.

Run as ``python tests/runtime/pipeline_cluster_client.py CLUSTER_JSON OUT_DIR``
from the repository root. Connects to the cluster (before any op), then for
every (K, M) of CONFIGS builds the same 4-layer PipeliningLayer with its
cells on the workers (``PipelineDevices``), runs one training step's loss and
gradients in a tf.function, and writes OUT_DIR/results.npz: the loss and
every gradient, and the devices of every variable, gradient and cell.
It also adds 1 to the CONFIGS[0] model's variables (on the workers) and
writes them as a checkpoint OUT_DIR/ckpt, every file written by this
process (CheckpointOptions io_device).

The test imports this file for ``Model`` and ``LossAndGrads`` and computes
the same in its own process without a cluster.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

from gpipe_tf.layers import core
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.runtime import pipeline_cluster

# (K cells, M micro-batches); over 2 workers of 2 devices each.
CONFIGS = ((3, 3), (2, 4), (4, 2))
DIMS = (8, 16, 16, 12, 4)
BATCH = 12


def Model(num_cells: int | None, num_micro_batches: int = 1,
          devices=None):
  """The 4 FC layers; a PipeliningLayer, or a SequentialLayer if K is None."""
  acts = ('TANH', 'RELU', 'SIGMOID', 'NONE')
  layers = [core.FCLayer.Params().Set(name=f'fc{i}', input_dim=DIMS[i],
                                      output_dim=DIMS[i + 1],
                                      activation=acts[i])
            for i in range(4)]
  if num_cells is None:
    return core.SequentialLayer.Params().Set(
        name='net', layers=layers).Instantiate()
  return PipeliningLayer.Params().Set(
      name='net', layers=layers, num_partitions=num_cells,
      num_micro_batches=num_micro_batches, devices=devices).Instantiate()


def Inputs():
  x = tf.sin(tf.reshape(tf.range(BATCH * DIMS[0], dtype=tf.float32),
                        [BATCH, DIMS[0]]))
  target = tf.cos(tf.reshape(tf.range(BATCH * DIMS[-1], dtype=tf.float32),
                             [BATCH, DIMS[-1]]))
  return x, target


def LossAndGrads(model):
  """(loss, {variable name: gradient}) of one step, in a tf.function."""
  variables = list(model.trainable_variables)

  @tf.function
  def _Step(x, target):
    with tf.GradientTape() as tape:
      y = model.FProp(x, training=True)
      # Weighs every example differently: a dropped or permuted row shows.
      w = tf.range(1, BATCH + 1, dtype=tf.float32)[:, None]
      loss = tf.reduce_mean(tf.square(y - target) * w)
    return loss, tape.gradient(loss, variables)

  loss, grads = _Step(*Inputs())
  return loss, {v.name: g for v, g in zip(variables, grads)}


def main(cluster_json: str, out_dir: str) -> None:
  cluster = pipeline_cluster.ParseCluster(cluster_json)
  pipeline_cluster.ConnectToCluster(cluster, timeout_seconds=60)
  results, placement = {}, {}
  for k, m in CONFIGS:
    model = Model(k, m, pipeline_cluster.PipelineDevices(k, cluster))
    loss, grads = LossAndGrads(model)
    results[f'K{k}M{m}/loss'] = loss.numpy()
    for name, g in grads.items():
      results[f'K{k}M{m}/{name}'] = g.numpy()
    placement[f'K{k}M{m}'] = {
        'cells': model.devices,
        'variables': {v.name: v.device for v in model.trainable_variables},
        'gradients': {name: g.device for name, g in grads.items()},
    }
    if (k, m) == CONFIGS[0]:  # Values the test can tell from the initial ones.
      for v in model.trainable_variables:
        v.assign(v + 1.0)
      checkpoint = tf.train.Checkpoint(model=model)
      checkpoint.write(os.path.join(out_dir, 'ckpt'),
                       options=tf.train.CheckpointOptions(
                           experimental_io_device=cluster.client_device))
  np.savez(os.path.join(out_dir, 'results.npz'), **results)
  with open(os.path.join(out_dir, 'placement.json'), 'w') as f:
    json.dump(placement, f)


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2])
