"""Keras masks through FromKeras: Embedding(mask_zero=True) and Masking masks travel with their tensors through the cells, and every layer that takes one gets it (as mask=, as query/value masks, or read off the tensor), so padded sequences give Keras's loss and gradients."""

import numpy as np

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top


_LENGTHS = np.array([6, 3, 2, 5, 1, 4, 6, 2])


def _Padded(values):
  """`values` [8, 6, ...] with example i's steps from _LENGTHS[i] on zero."""
  keep = np.arange(6)[None, :] < _LENGTHS[:, None]
  keep = keep.reshape(keep.shape + (1,) * (values.ndim - 2))
  return values * keep


def _EmbeddingMasked():
  """The mask of Embedding(mask_zero=True) read as LSTM's mask= (a tensor
  of the graph), off the tensor by MultiHeadAttention (query and value
  masks) and as GlobalAveragePooling1D's mask=, across cells."""
  ids = keras.Input((6,), dtype='int32')
  x = keras.layers.Embedding(10, 4, mask_zero=True, name='embed')(ids)
  x = keras.layers.Dense(4, name='fc')(x)
  seq, _, c = keras.layers.LSTM(4, return_sequences=True, return_state=True,
                                name='lstm')(x)
  att = keras.layers.MultiHeadAttention(2, 2, name='mha')(seq, seq)
  pooled = keras.layers.GlobalAveragePooling1D(name='pool')(att)
  y = keras.layers.Concatenate(name='cat')([pooled, c])
  return keras.Model(ids, keras.layers.Dense(2, name='out')(y))


def _Masking():
  x = keras.Input((6, 3))
  h = keras.layers.Masking(0.0, name='masking')(x)
  h = keras.layers.Bidirectional(
      keras.layers.GRU(3, return_sequences=True), name='bi')(h)
  h = keras.layers.GRU(3, name='gru')(h)
  return keras.Model(x, keras.layers.Dense(2, name='out')(h))


class KerasMasksTest(tf.test.TestCase):

  def _AssertSameStep(self, model, x, runs):
    targets = tf.random.stateless_normal([8, 2], seed=[7, 7])
    return test_utils.AssertPipelineEqualsKeras(self, model, x, targets, runs)

  def testEmbeddingMaskZero(self):
    ids = _Padded(np.random.default_rng(0).integers(1, 10, [8, 6]))
    params = self._AssertSameStep(
        _EmbeddingMasked(), tf.constant(ids, tf.int32),
        [(2, 'gpipe'), (2, 'zb_h1'), (4, '1f1b')])
    by_name = {p.name: p for p in params}
    # The mask is a tensor of the chain: the lstm reads it by keyword, and
    # the attention takes it on its inputs.
    self.assertIn('mask', by_name['lstm'].input_kwargs)
    self.assertLen(by_name['mha'].input_masks, 1)

  def testMasking(self):
    x = _Padded(np.random.default_rng(1).normal(size=[8, 6, 3]))
    self._AssertSameStep(_Masking(), tf.constant(x, tf.float32),
                         [(2, '1f1b')])


if __name__ == '__main__':
  tf.test.main()
