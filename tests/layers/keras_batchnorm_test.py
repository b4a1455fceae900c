"""keras_batchnorm: a Keras BatchNormalization inside a custom layer normalises each micro-batch with its own statistics and moves its moving statistics once per mini-batch in a pipeline, recompute or not."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import keras_layer
from gpipe_tf.layers import normalization
from gpipe_tf.pipeline import PipeliningLayer


@keras.saving.register_keras_serializable(package='gpipe_bn_test')
class DenseBnBlock(keras.layers.Layer):
  """Dense, BatchNormalization, relu in one custom layer (as keras_hub's
  MobileNet and EfficientNet blocks hold theirs)."""

  def __init__(self, units=3, renorm=False, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.renorm = renorm
    self.dense = keras.layers.Dense(units, name='dense')
    self.bn = keras.layers.BatchNormalization(momentum=0.5, renorm=renorm,
                                              name='bn')

  def build(self, input_shape):
    self.dense.build(input_shape)
    self.bn.build(input_shape[:-1] + (self.units,))

  def call(self, x, training=None):
    return keras.ops.relu(self.bn(self.dense(x), training=training))

  def get_config(self):
    return dict(super().get_config(), units=self.units, renorm=self.renorm)


def _Layers(**block):
  return [keras_layer.KerasLayer.Params().Set(
      name='block', keras_class='gpipe_bn_test>DenseBnBlock', config=block,
      input_shapes=[(None, 4)]),
          keras_layer.KerasLayer.Params().Set(
              name='fc', keras_class='Dense', config=dict(units=2),
              input_shapes=[(None, 3)])]


class KerasBatchNormTest(tf.test.TestCase):

  def testInnerBatchNormMovesOncePerMiniBatch(self):
    x = tf.random.stateless_normal([8, 4], seed=[4, 4]) * 3.0 + 1.0
    for remat in ('always', 'never'):
      with self.subTest(remat=remat):
        pipe = PipeliningLayer.Params().Set(
            name='net', layers=_Layers(), num_partitions=2,
            num_micro_batches=4, remat=remat,
            input_shapes=[(None, 4)]).Instantiate()
        block = pipe.layers[0].keras_layer
        with tf.GradientTape() as tape:
          y = pipe.FProp(x, training=True)
          loss = tf.reduce_sum(tf.sin(y))
        grads = tape.gradient(loss, pipe.trainable_variables)
        self.assertNotIn(None, grads)
        h = block.dense(x)
        mean, variance = tf.nn.moments(h, axes=[0])
        self.assertAllClose(0.5 * mean, block.bn.moving_mean, atol=1e-6)
        self.assertAllClose(0.5 + 0.5 * variance, block.bn.moving_variance,
                            atol=1e-5)
        # Each micro-batch normalised with its own statistics, as Keras
        # normalises each batch it is called on in training.
        normalised = tf.concat([block(xm, training=True)
                                for xm in tf.split(x, 4)], axis=0)
        self.assertAllClose(pipe.layers[1].FProp(normalised), y, atol=1e-5)

  def testKerasOwnUpdateWaitsForTheDeferral(self):
    # Called eagerly inside a deferral, twice (two micro-batches): Keras's
    # own assignment is dropped, and Apply moves the statistics once.
    block = _Layers()[0].Instantiate()
    bn = block.keras_layer.bn
    x = tf.random.stateless_normal([8, 4], seed=[5, 5]) * 2.0 + 1.0
    with normalization.DeferMovingStats() as deferred:
      for xm in tf.split(x, 2):
        block.FProp(xm, training=True)
    self.assertAllClose(tf.zeros([3]), bn.moving_mean)
    deferred.Apply()
    mean, _ = tf.nn.moments(block.keras_layer.dense(x), axes=[0])
    self.assertAllClose(0.5 * mean, bn.moving_mean, atol=1e-6)

  def testRenormIsRefused(self):
    with self.assertRaisesRegex(keras_layer.UnsupportedKerasLayerError,
                                "'bn' with renorm=True.*renorm=False"):
      _Layers(renorm=True)[0].Instantiate()


if __name__ == '__main__':
  tf.test.main()
