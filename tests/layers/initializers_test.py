"""Tests of gpipe_tf.layers.initializers: each method's range and scale, and that values follow from (path, seed) only."""

import math

import numpy as np
import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.layers import initializers

SHAPE = (64, 32)  # fan_in 64, fan_out 32.


def _Draw(init, shape=SHAPE, path='layer/w', seed=None):
  return initializers.Draw(init, shape, tf.float32,
                           initializers.path_seed(path, seed)).numpy()


class InitializersTest(tf.test.TestCase):

  def testParamsHoldMethodAndScale(self):
    p = initializers.Gaussian(0.5)
    self.assertEqual((p.method, p.scale), ('gaussian', 0.5))
    self.assertEqual(initializers.Xavier().method, 'xavier')
    self.assertEqual(initializers.Uniform(2).scale, 2.0)

  def testUnknownMethodIsANamedError(self):
    with self.assertRaisesRegex(initializers.UnknownInitMethodError,
                                "'he'.*xavier"):
      initializers.WeightInit('he')
    self.assertTrue(issubclass(initializers.UnknownInitMethodError,
                               errors.Error))
    bad = initializers.Constant()
    bad.method = 'he'
    with self.assertRaises(ValueError):
      _Draw(bad)

  def testConstant(self):
    self.assertAllEqual(_Draw(initializers.Constant(0.25)),
                        np.full(SHAPE, 0.25, np.float32))

  def testUniformLimits(self):
    xavier = math.sqrt(6.0 / (64 + 32))
    for init, limit in ((initializers.Xavier(2.0), 2.0 * xavier),
                        (initializers.Uniform(0.1), 0.1),
                        (initializers.WeightInit('uniform_sqrt_fanin'),
                         math.sqrt(3.0 / 64))):
      with self.subTest(method=init.method):
        values = _Draw(init)
        self.assertLessEqual(np.abs(values).max(), limit)
        # 2048 draws: the extremes come close to the limit.
        self.assertGreater(np.abs(values).max(), 0.9 * limit)

  def testGaussianStddev(self):
    for init, std in ((initializers.Gaussian(0.5), 0.5),
                      (initializers.WeightInit('gaussian_sqrt_fanin', 2.0),
                       2.0 / 16.0)):  # fan_in 256.
      with self.subTest(method=init.method):
        values = _Draw(init, shape=(256, 64))
        self.assertAllClose(values.std(), std, rtol=0.05)
        self.assertAllClose(values.mean(), 0.0, atol=0.05 * std)

  def testValuesFollowFromPathAndSeedOnly(self):
    init = initializers.Xavier()
    first = _Draw(init)
    self.assertAllEqual(first, _Draw(init))
    self.assertNotAllEqual(first, _Draw(init, path='layer/v'))
    self.assertNotAllEqual(first, _Draw(init, seed=1))
    self.assertAllEqual(initializers.path_seed('a', None),
                        initializers.path_seed('a', 0))


if __name__ == '__main__':
  tf.test.main()
