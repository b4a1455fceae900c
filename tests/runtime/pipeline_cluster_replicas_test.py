"""Data-parallel replicas of a pipeline on remote workers: where the cells go, and R x K on 2 workers computes what one process computes."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import json  # pylint: disable=g-import-not-at-top
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf import model_registry
from gpipe_tf.runtime import distribute
from gpipe_tf.runtime import pipeline_cluster
from gpipe_tf.train import loop
import pipeline_cluster_replicas_client as client_lib  # pylint: disable=g-bad-import-order
import pipeline_cluster_client as fc  # pylint: disable=g-bad-import-order
import pipeline_cluster_test as shared  # pylint: disable=g-bad-import-order

GROUP = shared.GROUP
MODEL = shared.MODEL
OVERRIDE = shared.REPLICAS_OVERRIDE
TRAINER_STEPS = shared.REPLICAS_TRAINER_STEPS


def _Task(t, d):
  return f'/job:worker/replica:0/task:{t}/device:CPU:{d}'


class ReplicaLayoutOnClusterTest(tf.test.TestCase):
  """The pure parts: R x K cells over the workers, and the layout's checks."""

  def testEachReplicaInAContiguousBlock(self):
    two_by_two = [[f't{t}d{d}' for d in range(2)] for t in range(2)]
    self.assertEqual(
        pipeline_cluster.AssignReplicaCells(2, 2, two_by_two),
        [['t0d0', 't0d1'], ['t1d0', 't1d1']])
    four_by_one = [[f't{t}d0'] for t in range(4)]
    self.assertEqual(
        pipeline_cluster.AssignReplicaCells(2, 2, four_by_one),
        [['t0d0', 't1d0'], ['t2d0', 't3d0']])
    # 6 cells over 3 workers of 3: replica 1 straddles workers 0 and 1.
    three_by_three = [[f't{t}d{d}' for d in range(3)] for t in range(3)]
    self.assertEqual(
        pipeline_cluster.AssignReplicaCells(3, 2, three_by_three),
        [['t0d0', 't0d1'], ['t1d0', 't1d1'], ['t2d0', 't2d1']])
    self.assertEqual(
        pipeline_cluster.AssignReplicaCells(2, 3, three_by_three[:2]),
        [['t0d0', 't0d1', 't0d2'], ['t1d0', 't1d1', 't1d2']])
    # One replica is AssignCells.
    self.assertEqual(pipeline_cluster.AssignReplicaCells(1, 3, two_by_two),
                     [pipeline_cluster.AssignCells(3, two_by_two)])

  def testTooSmallClusterSaysWhatWouldFit(self):
    two_by_one = [['t0d0'], ['t1d0']]
    with self.assertRaisesRegex(
        pipeline_cluster.CellLayoutError,
        r'^2 replicas x 2 cells = 4 cells over 2 workers put 2 cells on '
        r'worker 0, which has 1 devices .*--num_logical_devices=2 .*use 4 '
        r'workers of 1 devices each, or lower --num_replicas'):
      pipeline_cluster.AssignReplicaCells(2, 2, two_by_one)
    self.assertTrue(issubclass(pipeline_cluster.CellLayoutError,
                               pipeline_cluster.PipelineClusterError))
    with self.assertRaisesRegex(pipeline_cluster.CellLayoutError,
                                'num_replicas must be >= 1'):
      pipeline_cluster.AssignReplicaCells(0, 2, two_by_one)

  def testOnClusterLayout(self):
    rows = [[_Task(0, 0), _Task(0, 1)], [_Task(1, 0), _Task(1, 1)]]
    layout = distribute.ReplicaLayout.OnCluster(rows, 'trainer_cpu')
    self.assertEqual((layout.num_replicas, layout.devices_per_replica), (2, 2))
    self.assertEqual(layout.strategy_devices, [_Task(0, 0), _Task(1, 0)])
    self.assertIn('split on trainer_cpu', '\n'.join(layout.Describe()))
    with self.assertRaisesRegex(distribute.ReplicaLayoutError,
                                'same number'):
      distribute.ReplicaLayout.OnCluster([rows[0], rows[1][:1]], 'cpu')
    with self.assertRaisesRegex(distribute.ReplicaLayoutError,
                                'cells of two replicas'):
      distribute.ReplicaLayout.OnCluster([rows[0], rows[0]], 'cpu')


# The workers are pipeline_cluster_test's shared ones (one xdist worker runs
# the classes that use them).
@pytest.mark.xdist_group(GROUP)
class ReplicasOnWorkersTest(tf.test.TestCase):
  """2 worker servers x 2 CPU devices host 2 replicas x 2 cells."""

  def _ClientResults(self):
    out_dir = shared.ClientOutputs(self)['replicas']
    with open(os.path.join(out_dir, 'placement.json')) as f:
      placement = json.load(f)
    return out_dir, np.load(os.path.join(out_dir, 'results.npz')), placement

  def _CheckFcStep(self, got, placement):
    # Loss and gradients of the global batch, unpipelined, in this process.
    sequential = fc.Model(None)
    loss, grads = fc.LossAndGrads(sequential)
    self.assertLen(grads, 8)
    x, target = fc.Inputs()
    w = client_lib.Weights()
    half = fc.BATCH // 2
    for r in range(2):
      self.assertAllClose(got[f'{r}/loss'], loss, rtol=0, atol=1e-5)
      for name, g in grads.items():
        self.assertAllClose(got[f'{r}/{name}'], g, rtol=0, atol=1e-5,
                            msg=f'replica {r} {name}')
      # Each replica's own loss and gradients are those of its rows.
      rows = slice(r * half, (r + 1) * half)
      with tf.GradientTape() as tape:
        own = tf.reduce_mean(tf.square(
            sequential.FProp(x[rows], training=True) - target[rows]) * w[rows])
      own_grads = tape.gradient(own, sequential.trainable_variables)
      self.assertAllClose(got[f'{r}/own_loss'], own, rtol=0, atol=1e-5)
      for v, g in zip(sequential.trainable_variables, own_grads):
        self.assertAllClose(got[f'{r}/own/{v.name}'], g, rtol=0, atol=1e-5,
                            msg=f'replica {r} own {v.name}')

    # Replica r's cells on worker r; its gradients there; every variable
    # mirrored on each replica's first device.
    want_rows = [[_Task(t, 0), _Task(t, 1)] for t in range(2)]
    self.assertEqual(placement['rows'], want_rows)
    for r in range(2):
      self.assertEqual(sorted(set(placement['own_gradients'][str(r)])),
                       want_rows[r])
    self.assertEqual(sorted(placement['variables']), sorted(grads))
    for name, copies in placement['variables'].items():
      self.assertEqual(copies, [_Task(0, 0), _Task(1, 0)], name)
    return sequential

  def testTwoReplicasOfTwoCellsEqualOneProcess(self):
    out_dir, got, placement = self._ClientResults()
    sequential = self._CheckFcStep(got, placement)

    # The trainer wrote the workers' variables alone; this process restores
    # them into its unpipelined model. Replica 1's copies were updated too.
    before = {v.name: v.numpy() for v in sequential.trainable_variables}
    tf.train.Checkpoint(model=sequential).read(
        os.path.join(out_dir, 'ckpt')).assert_existing_objects_matched()
    for v in sequential.trainable_variables:
      self.assertAllClose(v.numpy(), before[v.name] + 1.0, rtol=0, atol=1e-6)
      self.assertAllClose(got[f'plus_one/{v.name}'], before[v.name] + 1.0,
                          rtol=0, atol=1e-6)

    # Training with Adam and cross-replica BatchNorm: the checkpoint equals
    # one replica's of the same 4 micro-batches in one process (weights, Adam
    # slots, moving statistics; those also equal the unpipelined model's),
    # and one process resumes from it.
    bn_cluster = os.path.join(out_dir, 'bn')
    one = os.path.join(self.get_temp_dir(), 'bn_one')
    plain = os.path.join(self.get_temp_dir(), 'bn_plain')
    steps = client_lib.TRAIN_STEPS
    loop.train(client_lib.PipedBatchNorm(None, 4), one, steps, num_replicas=1)
    loop.train(client_lib.PlainBatchNorm, plain, steps, num_replicas=1)
    a = test_utils.CheckpointValues(one)
    b = test_utils.CheckpointValues(bn_cluster)
    self.assertEqual(sorted(a), sorted(b))
    self.assertGreater(len(a), 10)
    for key in a:
      self.assertAllClose(a[key], b[key], rtol=0, atol=1e-5, msg=key)
    stats = [k for k in a if 'moving_' in k]
    self.assertLen(stats, 2)
    unpipelined = test_utils.CheckpointValues(plain)
    for key in stats:
      self.assertAllClose(unpipelined[key], b[key], rtol=0, atol=1e-5,
                          msg=key)
    copy = os.path.join(self.get_temp_dir(), 'bn_copy')
    shutil.copytree(bn_cluster, copy)
    resumed = loop.train(client_lib.PipedBatchNorm(), copy, steps + 1,
                         num_replicas=1)
    self.assertEqual(resumed.start_step, steps)

    # The trainer's main() (in the chief: shared.TRAINERS): --num_replicas=2
    # trains and checkpoints like one process on the same global batches.
    with open(os.path.join(out_dir, 'trainers.json')) as f:
      codes = json.load(f)
    output = shared.ReadFile(os.path.join(out_dir, 'trainer.log'))
    self.assertEqual(codes['trainer'], 0, output[-3000:])
    self.assertIn('Strategy MirroredStrategy: 2 replicas x 2 cells', output)
    self.assertIn(f'Pipeline cluster: replica 1 cell 1 on {_Task(1, 1)}',
                  output)
    params = model_registry.GetParams(MODEL)
    base_experiment.ApplyOverrides(params, OVERRIDE)
    one_process = os.path.join(self.get_temp_dir(), 'one_process')
    loop.train(params, one_process, TRAINER_STEPS,
               save_interval_steps=TRAINER_STEPS, num_replicas=1)
    a = test_utils.CheckpointValues(one_process, TRAINER_STEPS)
    b = test_utils.CheckpointValues(os.path.join(out_dir, 'trainer'),
                                    TRAINER_STEPS)
    self.assertEqual(sorted(a), sorted(b))
    for key in a:
      self.assertAllClose(a[key], b[key], rtol=0, atol=1e-5, msg=key)

    # A cluster too small for R x K: one line saying what would fit, the
    # last of the trainer's stderr; it exits with status 1.
    output = shared.ReadFile(os.path.join(out_dir, 'trainer_3.log'))
    self.assertEqual(codes['trainer_3'], 1, output[-3000:])
    shared.AssertOneErrorLine(self, output, re.escape(
        '3 replicas x 2 cells = 6 cells over 2 workers put 3 cells on worker '
        '0, which has 2 devices') + r'.*--num_logical_devices=3.*use 3 '
        'workers of 2 devices each')


if __name__ == '__main__':
  tf.test.main()
