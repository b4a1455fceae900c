"""Tests of gpipe_tf.layers.core: activations, FCLayer, DropoutLayer, SequentialLayer and their cost estimates."""

import numpy as np
import tensorflow as tf

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import random_seeds


def _Fc(name='fc', input_dim=3, output_dim=2, **kwargs):
  return core.FCLayer.Params().Set(name=name, input_dim=input_dim,
                                   output_dim=output_dim, **kwargs)


class ActivationTest(tf.test.TestCase):

  def testNamesAndUnknownName(self):
    x = tf.constant([-1.0, 0.5, 7.0])
    self.assertAllClose(core.Activation('RELU')(x), [0.0, 0.5, 7.0])
    self.assertAllClose(core.Activation('RELU6')(x), [0.0, 0.5, 6.0])
    self.assertAllClose(core.Activation('NONE')(x), x)
    with self.assertRaisesRegex(base_layer.LayerConfigError,
                                "'relu'.*RELU"):
      core.Activation('relu')

  def testActivationLayerCostsPerElement(self):
    p = core.ActivationLayer.Params().Set(activation='TANH')
    self.assertAllClose(p.Instantiate().FProp(tf.constant([0.5])),
                        [np.tanh(0.5)])
    meta = core.ActivationLayer.FPropMeta(p, (None, 5))
    self.assertEqual(meta.out_shapes, ((None, 5),))
    self.assertEqual(meta.num_params, 0)
    self.assertGreater(meta.flops, 0)

  def testTupleHelpers(self):
    self.assertEqual(core.AsTuple(1), (1,))
    self.assertEqual(core.AsTuple((1, 2)), (1, 2))
    self.assertEqual(core.FromTuple((1,)), 1)
    self.assertEqual(core.FromTuple((1, 2)), (1, 2))


class FCLayerTest(tf.test.TestCase):

  def testForwardIsActivationOfAffineMap(self):
    layer = _Fc(bias_init=0.5).Instantiate()
    x = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 1.0]], np.float32)
    want = np.maximum(x @ layer.w.numpy() + 0.5, 0.0)
    self.assertAllClose(layer.FProp(tf.constant(x)), want, rtol=1e-6)
    # Rank 3 goes through tensordot: the same per row.
    self.assertAllClose(layer.FProp(tf.constant(x[None])), want[None],
                        rtol=1e-6)
    self.assertEqual(sorted(v.name for v in layer.variables),
                     ['fc/b:0', 'fc/w:0'])
    self.assertEqual(layer.NumParams(), 3 * 2 + 2)

  def testNoBias(self):
    layer = _Fc(has_bias=False, activation='NONE').Instantiate()
    self.assertLen(layer.variables, 1)
    x = tf.ones([1, 3])
    self.assertAllClose(layer.FProp(x), tf.matmul(x, layer.w))

  def testBadParamsAndInputsAreNamedErrors(self):
    with self.assertRaisesRegex(base_layer.LayerConfigError,
                                "FCLayer 'fc' needs positive input_dim"):
      _Fc(input_dim=0).Instantiate()
    with self.assertRaisesRegex(base_layer.LayerInputError,
                                r'expects input of shape \[\.\.\., 3\]'):
      _Fc().Instantiate().FProp(tf.ones([2, 4]))

  def testMetaMatchesTheBuiltLayer(self):
    p = _Fc(input_dim=4, output_dim=5)
    meta = core.FCLayer.FPropMeta(p, (8, 4))
    self.assertEqual(meta.out_shapes, ((8, 5),))
    self.assertEqual(meta.num_params, p.Instantiate().NumParams())
    # 2 flops per multiply-add, plus bias and RELU per output.
    self.assertEqual(meta.flops, 2 * 8 * 4 * 5 + 8 * 5 * 2)


class DropoutLayerTest(tf.test.TestCase):

  def testIdentityUnlessTraining(self):
    layer = core.DropoutLayer.Params().Set(keep_prob=0.5).Instantiate()
    x = tf.ones([4, 8])
    self.assertAllEqual(layer.FProp(x), x)
    self.assertAllEqual(core.DropoutLayer.Params().Instantiate().FProp(
        x, training=True), x)

  def testMaskIsAFunctionOfTheStepSeed(self):
    layer = core.DropoutLayer.Params().Set(keep_prob=0.5).Instantiate()
    x = tf.ones([16, 16])
    seed = tf.constant([3, 4], tf.int64)
    with random_seeds.StepSeedScope(seed):
      first = layer.FProp(x, training=True)
    with random_seeds.StepSeedScope(seed):
      again = layer.FProp(x, training=True)
    with random_seeds.StepSeedScope(seed + 1):
      other = layer.FProp(x, training=True)
    self.assertAllEqual(first, again)
    self.assertNotAllEqual(first, other)
    # Kept elements are scaled by 1 / keep_prob.
    self.assertAllInSet(first, [0.0, 2.0])

  def testBroadcastDimsShareTheMask(self):
    layer = core.DropoutLayer.Params().Set(
        keep_prob=0.5, noise_shape_broadcast_dims=[0]).Instantiate()
    with random_seeds.StepSeedScope(tf.constant([1, 2], tf.int64)):
      y = layer.FProp(tf.ones([6, 32]), training=True)
    for row in range(1, 6):
      self.assertAllEqual(y[row], y[0])

  def testKeepProbOutOfRange(self):
    for keep_prob in (0.0, 1.5):
      with self.assertRaisesRegex(base_layer.LayerConfigError, 'keep_prob'):
        core.DropoutLayer.Params().Set(keep_prob=keep_prob).Instantiate()


class SequentialLayerTest(tf.test.TestCase):

  def testRunsChildrenInOrder(self):
    p = core.SequentialLayer.Params().Set(name='seq', layers=[
        _Fc('a', 3, 4), _Fc('b', 4, 2, activation='NONE')])
    seq = p.Instantiate()
    x = tf.ones([5, 3])
    self.assertAllClose(seq.FProp(x), seq.layers[1].FProp(
        seq.layers[0].FProp(x)))
    self.assertEqual([l.path for l in seq.layers], ['seq/a', 'seq/b'])
    meta = core.SequentialLayer.FPropMeta(p, (5, 3))
    self.assertEqual(meta.out_shapes, ((5, 2),))
    self.assertEqual(meta.num_params, seq.NumParams())
    self.assertEqual(meta.flops, sum(
        m.flops for m in core.MetaOfSequence(p.layers, ((5, 3),))))

  def testMismatchNamesBothLayers(self):
    p = core.SequentialLayer.Params().Set(name='seq', layers=[
        _Fc('a', 3, 4), _Fc('b', 5, 2)])
    with self.assertRaisesRegex(base_layer.ShapeMismatchError,
                                "layer 'seq/a' produced .* layer 'seq/b'"):
      p.Instantiate().FProp(tf.ones([2, 3]))
    with self.assertRaisesRegex(base_layer.ShapeMismatchError,
                                "layer 'a' produces .* layer 'b'"):
      core.MetaOfSequence(p.layers, ((2, 3),))

  def testNoLayers(self):
    with self.assertRaisesRegex(base_layer.LayerConfigError, 'has no layers'):
      core.SequentialLayer.Params().Instantiate()


if __name__ == '__main__':
  tf.test.main()
