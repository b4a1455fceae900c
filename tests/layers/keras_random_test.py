"""keras_random: Keras layers that draw from seed generators give the same masks pipelined (any schedule, recompute always) as unpipelined with the same step seed."""

import numpy as np

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import keras_random  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import random_seeds  # pylint: disable=g-import-not-at-top
from tools.keras_zoo import main as keras_zoo  # pylint: disable=g-import-not-at-top

_STEP_SEED = (11, 5)


def _Noisy():
  """Four layers that draw from Keras seed generators, none of them a
  keras.layers.Dropout (that one runs as gpipe_tf's DropoutLayer)."""
  x = inputs = keras.Input((6, 8))
  x = keras.layers.GaussianNoise(0.5, name='noise')(x)
  x = keras.layers.Dense(8, activation='tanh', name='fc0')(x)
  x = keras.layers.SpatialDropout1D(0.4, name='spatial')(x)
  h = keras.layers.MultiHeadAttention(2, 4, dropout=0.5, name='mha')(x, x)
  x = keras.layers.Add(name='res')([x, h])
  x = keras.layers.Dense(8, activation='tanh', name='fc1')(x)
  x = keras.layers.AlphaDropout(0.3, name='alpha')(x)
  x = keras.layers.GlobalAveragePooling1D(name='pool')(x)
  return keras.Model(inputs, keras.layers.Dense(3, name='logits')(x))


def _PerExample(outputs, targets):
  return tf.reduce_mean(tf.square(outputs - targets), axis=-1)


class KerasRandomTest(tf.test.TestCase):

  def testPipelinedEqualsUnpipelinedWithTheSameSeeds(self):
    model = _Noisy()
    params = pipeline.FromKeras(model)
    x = tf.random.stateless_normal([8, 6, 8], seed=[1, 2])
    targets = tf.random.stateless_normal([8, 3], seed=[1, 3])
    # The same Params in a SequentialLayer, micro-batch m under the step
    # seed FoldIn(step, m) that a pipeline gives it.
    want_loss, want = keras_zoo.UnpipelinedStep(
        model, params, x, targets, 4, _STEP_SEED, _PerExample)
    for schedule in ('gpipe', '1f1b', 'zb_h1'):
      with self.subTest(schedule=schedule):
        _, loss, got = keras_zoo.PipelineStep(
            model, params, x, targets, 4, _PerExample, step_seed=_STEP_SEED,
            num_partitions=2, schedule=schedule, remat='always')
        self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
        for a, b in zip(want, got):
          self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)
    # The draws are not vacuous: without randomness the loss is another.
    quiet = float(tf.reduce_mean(_PerExample(model(x, training=False),
                                             targets)))
    self.assertGreater(abs(quiet - float(want_loss)), 1e-3)

  def testDrawsArePureFunctionsOfStepSeedAndLayer(self):
    layer = keras.layers.GaussianNoise(1.0)
    layer.build((4, 5))
    x = tf.zeros([4, 5])

    def _Draw(step, layer_seed):
      with random_seeds.StepSeedScope(tf.constant(step, tf.int64)):
        with keras_random.StatelessDraws(layer, layer_seed):
          return layer(x, training=True)

    state = np.array(layer.seed_generator.state.numpy())
    self.assertAllEqual(_Draw((1, 2), 7), _Draw((1, 2), 7))
    self.assertNotAllClose(_Draw((1, 2), 7), _Draw((1, 3), 7))
    self.assertNotAllClose(_Draw((1, 2), 7), _Draw((1, 2), 8))
    # The generator's state is neither read nor moved; outside the scope
    # the layer draws from it as Keras does.
    self.assertAllEqual(state, layer.seed_generator.state.numpy())
    self.assertNotAllClose(layer(x, training=True), layer(x, training=True))


if __name__ == '__main__':
  tf.test.main()
