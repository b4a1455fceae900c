"""keras_shapes: a layer whose compute_output_shape disagrees with its call gets the shapes its call makes, in FromKeras's Params and in a pipeline's shape chain."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import pipeline
from gpipe_tf.layers import keras_shapes


@keras.saving.register_keras_serializable(package='gpipe_shapes_test')
class Trimmed(keras.layers.Layer):
  """Drops the first position but declares it kept (as keras_hub's SigLIP
  vision embedding declares a class token it does not make)."""

  def call(self, x):
    return x[:, 1:]

  def compute_output_shape(self, shape):
    return shape


@keras.saving.register_keras_serializable(package='gpipe_shapes_test')
class Doubled(keras.layers.Layer):
  """Returns (x twice along time, a rank-3 mask) but declares (B, 1, H) and
  a rank-2 mask (as keras_hub's XLNet declares its relative positions and
  attention masks)."""

  def call(self, x):
    t = keras.ops.shape(x)[1]
    mask = keras.ops.ones((keras.ops.shape(x)[0], t, t))
    return keras.ops.concatenate([x, x], axis=1), mask

  def compute_output_shape(self, shape):
    return (shape[0], 1, shape[2]), (shape[0], shape[1])


@keras.saving.register_keras_serializable(package='gpipe_shapes_test')
class MaskedMean(keras.layers.Layer):
  """The mean over time of x, scaled by the mean of a rank-3 mask."""

  def call(self, x, mask3):  # pylint: disable=arguments-differ
    return (keras.ops.mean(x, axis=1) *
            keras.ops.mean(mask3, axis=(1, 2))[:, None])

  def compute_output_shape(self, x_shape, mask3_shape):
    return (x_shape[0], x_shape[2])


def _Model():
  x = keras.Input((5, 3))
  h = Trimmed(name='trim')(x)
  h = keras.layers.Dense(4, name='fc')(h)
  d, mask = Doubled(name='double')(h)
  return keras.Model(x, MaskedMean(name='pool')(d, mask))


class KerasShapesTest(tf.test.TestCase):

  def testOnlyLayersDefiningTheirOwnShapesAreTraced(self):
    self.assertFalse(keras_shapes.OwnsShapes(keras.layers.Dense(2)))
    self.assertFalse(keras_shapes.OwnsShapes(keras.layers.Add()))
    self.assertTrue(keras_shapes.OwnsShapes(Trimmed()))

  def testSpecsAreThoseTheCallMakes(self):
    x = keras.KerasTensor((None, 5, 3))
    [trimmed] = keras_shapes.OutputSpecs(Trimmed(), [x], {},
                                         [keras.KerasTensor((None, 5, 3))])
    self.assertEqual(trimmed.shape, (None, 4, 3))
    # A size that follows the input (twice the time) is not kept at the
    # declared 1; the rank-3 mask gets its rank.
    x = keras.KerasTensor((None, None, 3))
    doubled, mask = keras_shapes.OutputSpecs(
        Doubled(), [x], {}, [keras.KerasTensor((None, 1, 3)),
                             keras.KerasTensor((None, None))])
    self.assertEqual(doubled.shape, (None, None, 3))
    self.assertEqual(mask.shape, (None, None, None))

  def testModelConvertsAndPipelines(self):
    model = _Model()
    params = pipeline.FromKeras(model)
    shapes = {p.name: p.input_shapes for p in params}
    self.assertEqual(shapes['fc'], [(None, 4, 3)])
    self.assertEqual(shapes['pool'], [(None, 8, 4), (None, 4, 4)])
    x = tf.random.stateless_normal([4, 5, 3], seed=[3, 3])
    pipe = pipeline.PipeliningLayer.Params().Set(
        name='net', layers=params, num_partitions=2, num_micro_batches=2,
        input_shapes=[(None, 5, 3)]).Instantiate()
    pipeline.LoadKerasWeights(pipe, model)
    self.assertAllClose(pipe.FProp(x), model(x), atol=1e-6)


if __name__ == '__main__':
  tf.test.main()
