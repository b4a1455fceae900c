"""tools/benchmark_lib and benchmark_tables: the grids, the measured rows and the R x K table."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from tools import benchmark_lib as lib  # pylint: disable=g-import-not-at-top
from tools import benchmark_tables as tables  # pylint: disable=g-import-not-at-top

# Tiny: the rows, not the timings, are under test.
_TINY = lib.ModelSpec(num_blocks=4, dim=8, batch_size=16)
_ROW_KEYS = ('pipeline', 'num_partitions', 'num_micro_batches', 'remat',
             'mode', 'num_replicas', 'examples_per_sec', 'peak_memory_bytes')


class ConfigsTest(tf.test.TestCase):

  def testReplicaGridFactorsTheDevices(self):
    configs = lib.ReplicaConfigs(4, [1, 2, 4], [2], ['never'], batch_size=16)
    self.assertEqual([(c['num_replicas'], c['num_partitions'])
                      for c in configs], [(1, 4), (2, 2), (4, 1)])
    self.assertTrue(all(c['pipeline'] and c['mode'] == 'train'
                        for c in configs))

  def testReplicasThatDoNotDivideAreNamedErrors(self):
    with self.assertRaisesRegex(ValueError, '3 replicas do not divide 4 dev'):
      lib.ReplicaConfigs(4, [3], [1], ['never'], batch_size=12)
    with self.assertRaisesRegex(ValueError, 'global batch of 9'):
      lib.ReplicaConfigs(2, [2], [1], ['never'], batch_size=9)

  def testMergeKeepsEachConfigurationOnce(self):
    kxm = lib.PipelineConfigs([1, 2], [1], ['never'], inference=False)
    rxk = lib.ReplicaConfigs(2, [1, 2], [1], ['never'], batch_size=16)
    merged = lib.Merge(kxm, rxk)
    self.assertEqual(merged, kxm + [rxk[1]])  # R=1 K=2 M=1 is in both.
    self.assertTrue(all(c['num_replicas'] == 1 for c in kxm))


class MeasureTest(tf.test.TestCase):

  def testReplicaGridRows(self):
    configs = lib.ReplicaConfigs(2, [1, 2], [1, 2], ['always'],
                                 _TINY.batch_size)
    rows = lib.Measure(_TINY, configs, num_devices=2, rounds=1,
                       steps_per_round=1, log=lambda line: None)
    self.assertLen(rows, 4)
    for cfg, row in zip(configs, rows):
      self.assertEqual(set(row), set(_ROW_KEYS))
      self.assertEqual({k: row[k] for k in cfg}, cfg)
      self.assertGreater(row['examples_per_sec'], 0)
      self.assertGreater(row['peak_memory_bytes'], 0)
    self.assertEqual([(r['num_replicas'], r['num_partitions']) for r in rows],
                     [(1, 2), (1, 2), (2, 1), (2, 1)])
    table = tables.ReplicaTable(rows, 2, [1, 2], [1, 2], ['always'])
    self.assertIn('| always | 1 x 2 | 1.00 (', table)
    self.assertIn('| always | 2 x 1 | ', table)

  def testTwoReplicasTakeTheSameStepsAsOne(self):
    # A large step size, so that summed instead of averaged replica gradients
    # (or two updates per step) would change the second loss.
    spec = lib.ModelSpec(num_blocks=4, dim=8, batch_size=16, learning_rate=0.5)
    devices = test_utils.devices.LogicalCpus()[:2]
    losses = {}
    for r, k in ((1, 2), (2, 1)):
      step = lib.MakeStep(spec, lib.Config(True, k, 2, 'always',
                                           num_replicas=r), devices)
      losses[r] = [float(step()) for _ in range(3)]
    self.assertNotAllClose(losses[1][0], losses[1][2])
    self.assertAllClose(losses[1], losses[2], rtol=1e-5)


if __name__ == '__main__':
  tf.test.main()
