"""Tests of gpipe_tf.runtime.cluster: TF_CONFIG parsing, refusals before TensorFlow starts, and the one-host defaults."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import json  # pylint: disable=g-import-not-at-top

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.runtime import cluster
from gpipe_tf.runtime import distribute


class ClusterTest(tf.test.TestCase):
  """The pure parts of the multi-worker set-up (the job itself: multi_worker_test)."""

  def testClusterFromTfConfig(self):
    spec = {'chief': ['h0:1'], 'worker': ['h1:1', 'h2:1']}
    env = {'TF_CONFIG': json.dumps({'cluster': spec,
                                    'task': {'type': 'worker', 'index': 1}})}
    self.assertEqual(cluster.ClusterFromEnvironment(env)['cluster'], spec)
    self.assertEqual(cluster.NumTrainingTasks(env), 3)
    self.assertEqual(cluster.TaskOrder(spec),
                     [('chief', 0), ('worker', 0), ('worker', 1)])
    for unset in ({}, {'TF_CONFIG': ''}, {'TF_CONFIG': '{"task": {}}'}):
      self.assertIsNone(cluster.ClusterFromEnvironment(unset))
      self.assertEqual(cluster.NumTrainingTasks(unset), 0)
    with self.assertRaisesRegex(cluster.ClusterConfigError, 'not valid JSON'):
      cluster.ClusterFromEnvironment({'TF_CONFIG': '{"cluster": '})
    with self.assertRaisesRegex(cluster.ClusterConfigError, 'JSON object'):
      cluster.ClusterFromEnvironment({'TF_CONFIG': '[1, 2]'})
    with self.assertRaisesRegex(cluster.ClusterConfigError, 'no task'):
      cluster.ClusterFromEnvironment(
          {'TF_CONFIG': json.dumps({'cluster': spec})})

  def testMakeMultiWorkerStrategyRefusesWhatItCannotRun(self):
    def Env(spec, kind='worker'):
      return {'TF_CONFIG': json.dumps({'cluster': spec,
                                       'task': {'type': kind, 'index': 0}})}
    # All refused before TensorFlow is configured.
    with self.assertRaisesRegex(cluster.ClusterConfigError, 'no cluster'):
      cluster.MakeMultiWorkerStrategy(environ={})
    with self.assertRaisesRegex(cluster.ClusterConfigError,
                                'at least 2.*unset TF_CONFIG'):
      cluster.MakeMultiWorkerStrategy(environ=Env({'worker': ['h:1']}))
    with self.assertRaisesRegex(cluster.ClusterConfigError,
                                'task worker:0 is not in its cluster'):
      cluster.MakeMultiWorkerStrategy(environ=Env({'chief': ['h:1']}))
    with self.assertRaisesRegex(cluster.ClusterConfigError, 'evaluator'):
      cluster.MakeMultiWorkerStrategy(environ=Env(
          {'worker': ['h:1', 'h:2'], 'evaluator': ['h:3']}, 'evaluator'))

  def testTasksThatRestoredDifferentStepsAreNamed(self):
    order = [('worker', 0), ('worker', 1)]
    cluster.CheckValuesAgree(order, [20, 20], 'global step', 'hint')
    with self.assertRaisesRegex(
        cluster.WorkerMismatchError,
        r'disagree on the global step \(worker:0=20, worker:1=0\); share it'):
      cluster.CheckValuesAgree(order, [20, 0], 'global step', 'share it')

  def testOneHostNeedsNoneOfIt(self):
    strategy = distribute.MakeStrategy(2, 2)
    for s in (None, strategy):
      self.assertFalse(cluster.IsMultiWorker(s))
      self.assertTrue(cluster.IsChief(s))
      self.assertIsNone(cluster.ScratchDirectory(s, '/logdir'))
      self.assertEqual(cluster.TaskName(s), '')
      cluster.CheckTasksAgree(s, 3, 'step', '')  # No-op.

  def testErrorsAreNamedAndKeepTheirBuiltInBases(self):
    self.assertTrue(issubclass(cluster.ClusterConfigError, errors.Error))
    self.assertTrue(issubclass(cluster.ClusterConfigError, ValueError))
    self.assertTrue(issubclass(cluster.WorkerMismatchError, RuntimeError))
    self.assertIn(tf.errors.UnavailableError, cluster.PEER_FAILURE_ERRORS)


if __name__ == '__main__':
  tf.test.main()
