"""Tests for gpipe_tf.layers.embedding: lookup and tied logits vs NumPy."""

import math

import numpy as np
import tensorflow as tf


from gpipe_tf.layers import base_layer  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import embedding


class EmbeddingTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.p = embedding.EmbeddingLayer.Params().Set(name='emb', vocab_size=7,
                                                   embedding_dim=4)
    self.ids = np.array([[0, 3, 6], [2, 2, 5]], np.int32)

  def testLookupMatchesTable(self):
    layer = self.p.Instantiate()
    y = layer.FProp(tf.constant(self.ids))
    self.assertAllEqual(layer.emb.numpy()[self.ids], y)
    scaled = self.p.Copy().Set(scale_sqrt_depth=True).Instantiate()
    self.assertAllClose(scaled.emb.numpy()[self.ids] * 2.0,
                        scaled.FProp(tf.constant(self.ids, tf.int64)))

  def testEmitLogitsIsTransposedTable(self):
    layer = self.p.Instantiate()
    x = np.random.RandomState(0).randn(2, 3, 4).astype(np.float32)
    logits = layer.EmitLogits(tf.constant(x))
    self.assertAllClose(x @ layer.emb.numpy().T, logits, atol=1e-5)
    with self.assertRaisesRegex(base_layer.LayerInputError, "'emb'"):
      layer.EmitLogits(tf.zeros([2, 5]))

  def testMetaPassthroughAndErrors(self):
    layer = self.p.Instantiate()
    paddings = tf.zeros([2, 3])
    y, pad = layer.FProp(tf.constant(self.ids), paddings)
    self.assertIs(pad, paddings)
    meta = embedding.EmbeddingLayer.FPropMeta(self.p, (2, 3), (2, 3))
    self.assertEqual(meta.out_shapes,
                     (tuple(y.shape.as_list()), (2, 3)))
    self.assertEqual(meta.num_params, layer.NumParams())
    self.assertEqual(meta.num_params, 28)
    self.assertEqual(
        embedding.EmbeddingLayer.FPropMeta(self.p, (None, 5)).out_shapes,
        ((None, 5, 4),))
    with self.assertRaisesRegex(base_layer.LayerInputError, 'integer'):
      layer.FProp(tf.zeros([2, 3]))
    with self.assertRaisesRegex(ValueError, "'bad'"):
      embedding.EmbeddingLayer.Params().Set(name='bad',
                                            vocab_size=3).Instantiate()

  def testDefaultInitIsUnitGaussian(self):
    p = self.p.Copy().Set(vocab_size=500, embedding_dim=40)
    std = float(tf.math.reduce_std(p.Instantiate().emb))
    self.assertBetween(std, 0.9, 1.1)
    p.params_init.scale = 1.0 / math.sqrt(40)
    std = float(tf.math.reduce_std(p.Instantiate().emb))
    self.assertBetween(std, 0.9 / math.sqrt(40), 1.1 / math.sqrt(40))

  def testGradientsFromLookupAndLogits(self):
    layer = self.p.Instantiate()
    with tf.GradientTape() as tape:
      y = layer.FProp(tf.constant(self.ids))
      loss = tf.reduce_sum(layer.EmitLogits(y)[..., 1])
    grad, = tape.gradient(loss, layer.trainable_variables)
    self.assertIsNotNone(grad)
    self.assertGreater(float(tf.reduce_sum(tf.abs(tf.convert_to_tensor(grad)))),
                       0.0)


if __name__ == '__main__':
  tf.test.main()
