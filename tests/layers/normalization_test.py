"""Tests for gpipe_tf.layers.normalization: batch and layer norm vs NumPy."""


import numpy as np
import tensorflow as tf


from gpipe_tf.layers import base_layer  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import normalization


def _NpNormalize(x, mean, variance, gamma, beta, epsilon):
  return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


class BatchNormTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.RandomState(1)
    self.x = (3.0 + 2.0 * self.rng.randn(4, 3, 2, 5)).astype(np.float32)
    self.p = normalization.BatchNormLayer.Params().Set(name='bn', dim=5,
                                                       decay=0.9)
    self.layer = self.p.Instantiate()
    self.gamma = self.rng.rand(5).astype(np.float32) + 0.5
    self.beta = self.rng.randn(5).astype(np.float32)
    self.layer.gamma.assign(self.gamma)
    self.layer.beta.assign(self.beta)

  def _Moments(self, x):
    return x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))

  def testTrainingUsesBatchStatsAndUpdatesMovingStats(self):
    y = self.layer.FProp(tf.constant(self.x), training=True)
    mean, var = self._Moments(self.x)
    self.assertAllClose(
        _NpNormalize(self.x, mean, var, self.gamma, self.beta, 1e-3), y,
        atol=1e-5)
    self.assertAllClose(0.1 * mean, self.layer.moving_mean, atol=1e-6)
    self.assertAllClose(0.9 + 0.1 * var, self.layer.moving_variance,
                        atol=1e-5)

  def testInsideTfFunction(self):
    @tf.function
    def Step(x):
      return self.layer.FProp(x, training=True)

    x = tf.constant(self.x)
    Step(x)
    Step(x)
    mean, _ = self._Moments(self.x)
    self.assertAllClose((1 - 0.9**2) * mean, self.layer.moving_mean,
                        atol=1e-5)

  def testEvalUsesMovingStatsWithoutUpdating(self):
    moving_mean = self.rng.randn(5).astype(np.float32)
    moving_var = self.rng.rand(5).astype(np.float32) + 0.5
    self.layer.moving_mean.assign(moving_mean)
    self.layer.moving_variance.assign(moving_var)
    y = self.layer.FProp(tf.constant(self.x), training=False)
    self.assertAllClose(
        _NpNormalize(self.x, moving_mean, moving_var, self.gamma, self.beta,
                     1e-3), y, atol=1e-5)
    self.assertAllEqual(moving_mean, self.layer.moving_mean)
    self.assertAllEqual(moving_var, self.layer.moving_variance)

  def testUseMovingAvgInTraining(self):
    p = self.p.Copy().Set(use_moving_avg_in_training=True)
    layer = p.Instantiate()
    y = layer.FProp(tf.constant(self.x), training=True)
    self.assertAllClose(_NpNormalize(self.x, 0.0, 1.0, 1.0, 0.0, 1e-3), y,
                        atol=1e-5)
    mean, _ = self._Moments(self.x)
    self.assertAllClose(0.1 * mean, layer.moving_mean, atol=1e-6)

  def testSufficientStatisticsAccumulateOverMicroBatches(self):
    parts = [tf.constant(self.x[:1]), tf.constant(self.x[1:])]
    stats = [self.layer.SufficientStatistics(x) for x in parts]
    total, total_sq, count = (tf.add_n(list(s)) for s in zip(*stats))
    mean, var = self.layer.MomentsFromSufficientStatistics(total, total_sq,
                                                           count)
    full_mean, full_var, full_count = self.layer.ComputeMoments(
        tf.constant(self.x))
    self.assertEqual(float(count), 24.0)
    self.assertEqual(float(full_count), 24.0)
    self.assertAllClose(full_mean, mean, atol=1e-5)
    self.assertAllClose(full_var, var, atol=1e-4)
    self.layer.UpdateMovingStats(mean, var)
    self.assertAllClose(0.1 * self._Moments(self.x)[0],
                        self.layer.moving_mean, atol=1e-5)

  def testGradientsAndTrainability(self):
    self.assertCountEqual(['gamma', 'beta'], [
        v.name.split('/')[-1].split(':')[0]
        for v in self.layer.trainable_variables])
    with tf.GradientTape() as tape:
      y = self.layer.FProp(tf.constant(self.x), training=True)
      loss = tf.reduce_sum(y * tf.constant(self.rng.randn(*self.x.shape),
                                           tf.float32))
    grads = tape.gradient(loss, self.layer.trainable_variables)
    self.assertLen(grads, 2)
    for g in grads:
      self.assertIsNotNone(g)

  def testMetaAndErrors(self):
    meta = normalization.BatchNormLayer.FPropMeta(self.p, self.x.shape)
    self.assertEqual(meta.num_params, self.layer.NumParams())
    self.assertEqual(meta.num_params, 20)
    y = self.layer.FProp(tf.constant(self.x))
    self.assertEqual(meta.out_shapes, (tuple(y.shape.as_list()),))
    self.assertGreater(meta.flops, 0)
    with self.assertRaisesRegex(base_layer.LayerInputError, "'bn'"):
      self.layer.FProp(tf.zeros([2, 4]), training=True)
    with self.assertRaises(base_layer.LayerInputError):
      normalization.BatchNormLayer.FPropMeta(self.p, (2, 4))
    for kw in (dict(dim=0), dict(dim=3, decay=1.0), dict(dim=3, epsilon=0.0)):
      with self.assertRaisesRegex(ValueError, "'bad'"):
        normalization.BatchNormLayer.Params().Set(name='bad',
                                                  **kw).Instantiate()


class LayerNormTest(tf.test.TestCase):

  def testMatchesNumpy(self):
    rng = np.random.RandomState(2)
    x = (1.0 + 3.0 * rng.randn(2, 3, 6)).astype(np.float32)
    p = normalization.LayerNorm.Params().Set(name='ln', input_dim=6)
    layer = p.Instantiate()
    scale = rng.randn(6).astype(np.float32)
    bias = rng.randn(6).astype(np.float32)
    layer.scale.assign(scale)
    layer.bias.assign(bias)
    y = layer.FProp(tf.constant(x))
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    self.assertAllClose((x - mean) / np.sqrt(var + 1e-6) * scale + bias, y,
                        atol=1e-5)
    meta = normalization.LayerNorm.FPropMeta(p, x.shape)
    self.assertEqual(meta.num_params, layer.NumParams())
    self.assertEqual(meta.out_shapes, ((2, 3, 6),))

  def testPassthroughGradientsAndErrors(self):
    p = normalization.LayerNorm.Params().Set(name='ln', input_dim=4)
    layer = p.Instantiate()
    x = tf.random.stateless_normal([3, 4], [1, 2])
    paddings = tf.zeros([3, 2])
    with tf.GradientTape() as tape:
      y, pad = layer.FProp(x, paddings)
      loss = tf.reduce_sum(y * tf.range(4, dtype=tf.float32))
    self.assertIs(pad, paddings)
    for g in tape.gradient(loss, layer.trainable_variables):
      self.assertIsNotNone(g)
    self.assertEqual(
        normalization.LayerNorm.FPropMeta(p, (3, 4), (3, 2)).out_shapes,
        ((3, 4), (3, 2)))
    with self.assertRaisesRegex(base_layer.LayerInputError, "'ln'"):
      layer.FProp(tf.zeros([3, 5]))
    with self.assertRaises(ValueError):
      normalization.LayerNorm.Params().Set(name='ln').Instantiate()

  def testBfloat16KeepsDtype(self):
    p = normalization.LayerNorm.Params().Set(name='ln', input_dim=4,
                                             dtype='bfloat16')
    y = p.Instantiate().FProp(tf.constant([[1.0, 2.0, 3.0, 4.0]],
                                          tf.bfloat16))
    self.assertEqual(y.dtype, tf.bfloat16)
    x = np.array([1.0, 2.0, 3.0, 4.0])
    self.assertAllClose((x - 2.5) / np.sqrt(1.25), tf.cast(y[0], tf.float32),
                        atol=2e-2)


if __name__ == '__main__':
  tf.test.main()
