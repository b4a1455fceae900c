"""Keras recurrent layers through FromKeras: LSTM, GRU, SimpleRNN and Bidirectional, with sequences, states and initial states, equal Keras at dropout 0 and repeat their dropout masks in the recompute."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import keras  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import errors  # pylint: disable=g-import-not-at-top
from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
from tools.keras_zoo import main as keras_zoo  # pylint: disable=g-import-not-at-top


def _Recurrent(dropout=0.0, recurrent_dropout=0.0):
  """An LSTM giving its sequence and both states, a GRU started from the
  LSTM's h (a tensor keyword), a Bidirectional SimpleRNN, a head reading
  the LSTM's c (a skip over two layers)."""
  inputs = keras.Input((5, 3))
  seq, h, c = keras.layers.LSTM(
      6, return_sequences=True, return_state=True, dropout=dropout,
      recurrent_dropout=recurrent_dropout, name='lstm')(inputs)
  seq = keras.layers.GRU(6, return_sequences=True, dropout=dropout,
                         recurrent_dropout=recurrent_dropout,
                         name='gru')(seq, initial_state=h)
  last = keras.layers.Bidirectional(
      keras.layers.SimpleRNN(4, dropout=dropout), name='birnn')(seq)
  y = keras.layers.Concatenate(name='cat')([last, c])
  return keras.Model(inputs, keras.layers.Dense(3, name='logits')(y),
                     name='recurrent')


def _Randomize(model, seed):
  rng = np.random.default_rng(seed)
  model.set_weights([rng.normal(0.0, 0.5, w.shape) for w in model.weights])


class KerasRecurrentTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.x = tf.random.stateless_normal([8, 5, 3], seed=[3, 1])
    self.targets = tf.random.stateless_normal([8, 3], seed=[3, 2])

  def testEqualsKerasAtDropoutZero(self):
    model = _Recurrent()
    _Randomize(model, 1)
    # gpipe and zb_h1 here, 1f1b in testDropoutRepeatsInRecompute: each
    # schedule runs the recurrent layers once in this file (every schedule
    # at every K on other models: keras_import_test's grid).
    test_utils.AssertPipelineEqualsKeras(
        self, model, self.x, self.targets,
        [(2, schedule) for schedule in ('gpipe', 'zb_h1')])

  def testDropoutRepeatsInRecompute(self):
    model = _Recurrent(dropout=0.3, recurrent_dropout=0.3)
    _Randomize(model, 2)
    params = pipeline.FromKeras(model)
    want_loss, want = keras_zoo.UnpipelinedStep(
        model, params, self.x, self.targets, 4, (5, 6))
    _, loss, got = keras_zoo.PipelineStep(
        model, params, self.x, self.targets, 4, step_seed=(5, 6),
        num_partitions=2, schedule='1f1b', remat='always')
    self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
    for var, g, h in zip(model.trainable_variables, want, got):
      self.assertAllClose(g, h, rtol=1e-5, atol=1e-6, msg=var.path)
    # The masks drop something: the loss is not the one without dropout.
    quiet, _ = keras_zoo.KerasStep(model, self.x, self.targets, 4)
    self.assertGreater(abs(float(quiet) - float(loss)), 1e-4)

  def testStatefulIsRefused(self):
    stateful = keras.Sequential([
        keras.Input((5, 3), batch_size=4),
        keras.layers.GRU(2, stateful=True, name='gru')])
    with self.assertRaisesRegex(errors.Error, 'stateful=False'):
      layers.SequentialLayer.Params().Set(
          name='net', layers=pipeline.FromKeras(stateful)).Instantiate()


if __name__ == '__main__':
  tf.test.main()
