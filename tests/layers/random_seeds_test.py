"""Tests of gpipe_tf.layers.random_seeds: scoped step seeds make a layer's randomness reproducible."""

import tensorflow as tf

from gpipe_tf.layers import random_seeds


class RandomSeedsTest(tf.test.TestCase):

  def testScopeSetsAndRestoresTheStepSeed(self):
    self.assertIsNone(random_seeds.CurrentStepSeed())
    with random_seeds.StepSeedScope([1, 2]) as outer:
      self.assertEqual(outer.dtype, tf.int64)
      self.assertAllEqual(random_seeds.CurrentStepSeed(), [1, 2])
      with random_seeds.StepSeedScope(tf.constant([5, 6])):
        self.assertAllEqual(random_seeds.CurrentStepSeed(), [5, 6])
      self.assertAllEqual(random_seeds.CurrentStepSeed(), [1, 2])
    self.assertIsNone(random_seeds.CurrentStepSeed())

  def testLayerSeedIsAFunctionOfStepAndLayer(self):
    with random_seeds.StepSeedScope([1, 2]):
      a = random_seeds.LayerSeed(7)
      again = random_seeds.LayerSeed(7)
      other_layer = random_seeds.LayerSeed(8)
    with random_seeds.StepSeedScope([1, 3]):
      other_step = random_seeds.LayerSeed(7)
    self.assertAllEqual(a, again)
    self.assertNotAllEqual(a, other_layer)
    self.assertNotAllEqual(a, other_step)
    self.assertEqual(a.shape, (2,))

  def testOutsideAScopeEveryCallDrawsAFreshSeed(self):
    self.assertNotAllEqual(random_seeds.LayerSeed(7),
                           random_seeds.LayerSeed(7))

  def testFoldInAndNameSeed(self):
    seed = tf.constant([1, 2], tf.int64)
    self.assertAllEqual(random_seeds.FoldIn(seed, 3),
                        random_seeds.FoldIn(seed, 3))
    self.assertNotAllEqual(random_seeds.FoldIn(seed, 3),
                           random_seeds.FoldIn(seed, 4))
    self.assertEqual(random_seeds.NameSeed('model/fc'),
                     random_seeds.NameSeed('model/fc'))
    self.assertNotEqual(random_seeds.NameSeed('model/fc'),
                        random_seeds.NameSeed('model/fc2'))
    self.assertBetween(random_seeds.NameSeed('x'), 0, 2**31 - 1)


if __name__ == '__main__':
  tf.test.main()
