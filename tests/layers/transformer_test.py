"""Tests for gpipe_tf.layers.transformer: masks, padding invariance, costs."""

import math

import numpy as np
import tensorflow as tf


from gpipe_tf.layers import base_layer  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import core
from gpipe_tf.layers import embedding
from gpipe_tf.layers import losses
from gpipe_tf.layers import normalization
from gpipe_tf.layers import random_seeds
from gpipe_tf.layers import transformer

Encoder = transformer.TransformerEncoderLayer
Decoder = transformer.TransformerDecoderLayer
FeedForward = transformer.TransformerFeedForwardLayer


def _NpLayerNorm(ln, x):
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return ((x - mean) / np.sqrt(var + ln.p.epsilon) * ln.scale.numpy() +
          ln.bias.numpy())


def _NpFfn(layer, x):
  h = _NpLayerNorm(layer.ln, x) if layer.p.pre_layer_norm else x
  h = np.maximum(h @ layer.fc1.w.numpy() + layer.fc1.b.numpy(), 0.0)
  y = x + h @ layer.fc2.w.numpy() + layer.fc2.b.numpy()
  return y if layer.p.pre_layer_norm else _NpLayerNorm(layer.ln, y)


def _Grads(test, layer, fn):
  with tf.GradientTape() as tape:
    loss = fn()
  grads = tape.gradient(loss, layer.trainable_variables)
  for v, g in zip(layer.trainable_variables, grads):
    test.assertIsNotNone(g, v.name)
  return grads


class FeedForwardTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.p = FeedForward.Params().Set(name='ffn', input_dim=4, hidden_dim=6)
    self.x = np.random.RandomState(4).randn(2, 3, 4).astype(np.float32)

  def testMatchesNumpyPreAndPostNorm(self):
    for pre in (True, False):
      layer = self.p.Copy().Set(pre_layer_norm=pre).Instantiate()
      layer.fc1.b.assign(np.linspace(-1, 1, 6).astype(np.float32))
      self.assertAllClose(_NpFfn(layer, self.x),
                          layer.FProp(tf.constant(self.x)), atol=1e-5)

  def testInitScaleByNumLayers(self):
    plain = self.p.Instantiate()
    scaled = self.p.Copy().Set(ffn_init_scale_by_num_layers=16).Instantiate()
    self.assertAllClose(plain.fc2.w.numpy() / 4.0, scaled.fc2.w, atol=1e-7)
    self.assertAllEqual(plain.fc1.w, scaled.fc1.w)
    encoder = Encoder.Params().Set(name='enc', model_dim=4, hidden_dim=6,
                                   ffn_init_scale_by_num_layers=4)
    enc_plain = encoder.Copy().Set(ffn_init_scale_by_num_layers=0)
    self.assertAllClose(enc_plain.Instantiate().ffn.fc2.w.numpy() / 2.0,
                        encoder.Instantiate().ffn.fc2.w, atol=1e-7)
    with self.assertRaises(ValueError):
      self.p.Copy().Set(ffn_init_scale_by_num_layers=-1).Instantiate()

  def testDropoutSeededInTrainingOnly(self):
    layer = self.p.Copy().Set(residual_dropout_prob=0.5,
                              relu_dropout_prob=0.5).Instantiate()
    x = tf.constant(self.x)
    seed = tf.constant([1, 2], tf.int64)
    with random_seeds.StepSeedScope(seed):
      a = layer.FProp(x, training=True)
    with random_seeds.StepSeedScope(seed):
      b = layer.FProp(x, training=True)
    self.assertAllEqual(a, b)
    self.assertAllClose(_NpFfn(layer, self.x), layer.FProp(x), atol=1e-5)
    self.assertNotAllClose(a, layer.FProp(x))

  def testMetaGradientsPassthrough(self):
    layer = self.p.Instantiate()
    pads = tf.zeros([2, 3])
    y, out_pads = layer.FProp(tf.constant(self.x), pads)
    self.assertIs(out_pads, pads)
    meta = FeedForward.FPropMeta(self.p, (2, 3, 4), (2, 3))
    self.assertEqual(meta.out_shapes, (tuple(y.shape.as_list()), (2, 3)))
    self.assertEqual(meta.num_params, layer.NumParams())
    self.assertGreaterEqual(meta.flops, 2 * 2 * (2 * 3 * 4 * 6))
    self.assertLen(_Grads(self, layer, lambda: tf.reduce_sum(
        layer.FProp(tf.constant(self.x)) ** 2)), 6)
    with self.assertRaisesRegex(base_layer.LayerInputError, "'ffn'"):
      layer.FProp(tf.zeros([2, 5]))


class EncoderDecoderTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = rng = np.random.RandomState(5)
    self.enc_p = Encoder.Params().Set(name='enc', model_dim=8, hidden_dim=16,
                                      num_heads=2)
    self.dec_p = Decoder.Params().Set(name='dec', model_dim=8, hidden_dim=16,
                                      num_heads=2)
    self.x = rng.randn(2, 5, 8).astype(np.float32)
    self.x_pad = np.array([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]], np.float32)
    self.y = rng.randn(2, 4, 8).astype(np.float32)
    self.y_pad = np.array([[0, 0, 0, 1], [0, 0, 1, 1]], np.float32)

  def _Dec(self, layer, y, enc):
    return layer.FProp(tf.constant(y), tf.constant(self.y_pad),
                       tf.constant(enc), tf.constant(self.x_pad))[0]

  def testEncoderComposesItsBlocks(self):
    layer = self.enc_p.Instantiate()
    x, pads = tf.constant(self.x), tf.constant(self.x_pad)
    out, out_pads = layer.FProp(x, pads)
    self.assertIs(out_pads, pads)
    h = x + layer.self_atten.FProp(layer.self_atten_ln.FProp(x), None, pads)
    self.assertAllClose(layer.ffn.FProp(h), out, atol=1e-5)

  def testEncoderPaddingInvariance(self):
    layer = self.enc_p.Instantiate()
    changed = self.x.copy()
    changed[self.x_pad > 0] = 9.0 * self.rng.randn(2, 8)
    pads = tf.constant(self.x_pad)
    a = layer.FProp(tf.constant(self.x), pads)[0].numpy()
    b = layer.FProp(tf.constant(changed), pads)[0].numpy()
    keep = self.x_pad == 0
    self.assertAllClose(a[keep], b[keep], atol=1e-5)
    unmasked = layer.FProp(tf.constant(changed), tf.zeros([2, 5]))[0].numpy()
    self.assertNotAllClose(a[keep], unmasked[keep])

  def testEncoderPassesExtraInputsThrough(self):
    layer = self.enc_p.Instantiate()
    extra = (tf.constant([1, 2]), tf.zeros([2, 4]))
    out = layer.FProp(tf.constant(self.x), tf.constant(self.x_pad), *extra)
    self.assertLen(out, 4)
    self.assertIs(out[2], extra[0])
    meta = Encoder.FPropMeta(self.enc_p, (2, 5, 8), (2, 5), (2,), (2, 4))
    self.assertEqual(meta.out_shapes, ((2, 5, 8), (2, 5), (2,), (2, 4)))

  def testDecoderIsCausal(self):
    layer = self.dec_p.Instantiate()
    changed = self.y.copy()
    # Random, not constant: a pre-LN block ignores a constant shift.
    changed[:, 2:] += self.rng.randn(2, 2, 8).astype(np.float32)
    a = self._Dec(layer, self.y, self.x)
    b = self._Dec(layer, changed, self.x)
    self.assertAllClose(a[:, :2], b[:, :2], atol=1e-5)
    self.assertNotAllClose(a[:, 2], b[:, 2])

  def testDecoderPaddingInvariance(self):
    layer = self.dec_p.Instantiate()
    enc = self.x.copy()
    enc[self.x_pad > 0] = 9.0 * self.rng.randn(2, 8)
    y = self.y.copy()
    y[self.y_pad > 0] = 9.0 * self.rng.randn(3, 8)
    a = self._Dec(layer, self.y, self.x).numpy()
    b = self._Dec(layer, y, enc).numpy()
    keep = self.y_pad == 0
    self.assertAllClose(a[keep], b[keep], atol=1e-5)
    unmasked = layer.FProp(tf.constant(self.y), tf.constant(self.y_pad),
                           tf.constant(enc), tf.zeros([2, 5]))[0].numpy()
    self.assertNotAllClose(a[keep], unmasked[keep])

  def testDecoderSelfAttentionMasksLeftPadding(self):
    # Right padding is hidden by the causal mask anyway; left padding is not.
    layer = self.dec_p.Copy().Set(has_cross_attention=False).Instantiate()
    pads = np.array([[1, 0, 0, 0], [1, 1, 0, 0]], np.float32)
    y = self.y.copy()
    y[pads > 0] = 9.0 * self.rng.randn(3, 8)
    a = layer.FProp(tf.constant(self.y), tf.constant(pads))[0].numpy()
    b = layer.FProp(tf.constant(y), tf.constant(pads))[0].numpy()
    keep = pads == 0
    self.assertAllClose(a[keep], b[keep], atol=1e-5)
    unmasked = layer.FProp(tf.constant(y), tf.zeros([2, 4]))[0].numpy()
    self.assertNotAllClose(a[keep], unmasked[keep])

  def testDecoderOnly(self):
    p = self.dec_p.Copy().Set(has_cross_attention=False)
    layer = p.Instantiate()
    self.assertFalse(hasattr(layer, 'cross_atten'))
    out = layer.FProp(tf.constant(self.y), tf.constant(self.y_pad))
    self.assertLen(out, 2)
    meta = Decoder.FPropMeta(p, (2, 4, 8), (2, 4))
    self.assertEqual(meta.out_shapes, ((2, 4, 8), (2, 4)))
    self.assertEqual(meta.num_params, layer.NumParams())
    with self.assertRaisesRegex(base_layer.LayerInputError, 'only'):
      layer.FProp(tf.constant(self.y), tf.constant(self.y_pad),
                  tf.constant(self.x), tf.constant(self.x_pad))
    with self.assertRaisesRegex(base_layer.LayerInputError, 'no encoder'):
      self.dec_p.Instantiate().FProp(tf.constant(self.y),
                                     tf.constant(self.y_pad))
    with self.assertRaises(base_layer.LayerInputError):
      Decoder.FPropMeta(p, (2, 4, 8), (2, 4), (2, 5, 8), (2, 5))

  def testMetaMatchesLayers(self):
    enc = self.enc_p.Instantiate()
    out = enc.FProp(tf.constant(self.x), tf.constant(self.x_pad))
    meta = Encoder.FPropMeta(self.enc_p, (2, 5, 8), (2, 5))
    self.assertEqual(meta.out_shapes,
                     tuple(tuple(o.shape.as_list()) for o in out))
    self.assertEqual(meta.num_params, enc.NumParams())
    dec = self.dec_p.Instantiate()
    out = dec.FProp(tf.constant(self.y), tf.constant(self.y_pad),
                    tf.constant(self.x), tf.constant(self.x_pad))
    dec_meta = Decoder.FPropMeta(self.dec_p, (2, 4, 8), (2, 4), (2, 5, 8),
                                 (2, 5))
    self.assertEqual(dec_meta.out_shapes,
                     tuple(tuple(o.shape.as_list()) for o in out))
    self.assertEqual(dec_meta.num_params, dec.NumParams())
    # Attention 4*D*D + 3*D + D, FFN 2*D*F + F + D, LayerNorms 2*D each.
    d, f = 8, 16
    atten, ffn = 4 * d * d + 4 * d, 2 * d * f + f + d
    self.assertEqual(meta.num_params, atten + ffn + 2 * 2 * d)
    self.assertEqual(dec_meta.num_params, 2 * atten + ffn + 3 * 2 * d)
    self.assertGreater(dec_meta.flops, meta.flops * 4 / 5)

  def testGradientsReachAllVariables(self):
    dec = self.dec_p.Copy().Set(residual_dropout_prob=0.1,
                                atten_dropout_prob=0.1,
                                relu_dropout_prob=0.1).Instantiate()
    grads = _Grads(self, dec, lambda: tf.reduce_sum(dec.FProp(
        tf.constant(self.y), tf.constant(self.y_pad), tf.constant(self.x),
        tf.constant(self.x_pad), training=True)[0] ** 2))
    self.assertLen(grads, 2 * 8 + 6 + 2 * 2)
    enc = self.enc_p.Instantiate()
    self.assertLen(_Grads(self, enc, lambda: tf.reduce_sum(enc.FProp(
        tf.constant(self.x), tf.constant(self.x_pad))[0] ** 2)), 8 + 6 + 2)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, 'divide'):
      self.enc_p.Copy().Set(num_heads=3).Instantiate()
    with self.assertRaisesRegex(ValueError, "'enc'"):
      self.enc_p.Copy().Set(model_dim=0).Instantiate()
    with self.assertRaises(ValueError):
      self.enc_p.Copy().Set(hidden_dim=0).Instantiate()
    with self.assertRaises(ValueError):
      self.enc_p.Copy().Set(residual_dropout_prob=1.0).Instantiate()
    enc = self.enc_p.Instantiate()
    with self.assertRaisesRegex(base_layer.LayerInputError, "'enc'"):
      enc.FProp(tf.zeros([2, 5, 4]), tf.zeros([2, 5]))
    with self.assertRaisesRegex(base_layer.LayerInputError, 'paddings'):
      enc.FProp(tf.zeros([2, 5, 8]), None)


class LanguageModelStackTest(tf.test.TestCase):
  """A decoder-only LM as a SequentialLayer of Params: the pipeline's input."""

  def testSequenceOfLayersRunsAndCosts(self):
    vocab, dim = 11, 8
    block = Decoder.Params().Set(model_dim=dim, hidden_dim=16, num_heads=2,
                                 has_cross_attention=False,
                                 ffn_init_scale_by_num_layers=2)
    stack = core.SequentialLayer.Params().Set(name='lm', layers=[
        embedding.EmbeddingLayer.Params().Set(name='emb', vocab_size=vocab,
                                              embedding_dim=dim),
        block.Copy().Set(name='dec0'), block.Copy().Set(name='dec1'),
        normalization.LayerNorm.Params().Set(name='ln', input_dim=dim),
        losses.SoftmaxLayer.Params().Set(name='softmax', input_dim=dim,
                                         num_classes=vocab),
    ])
    lm = stack.Instantiate()
    ids = tf.constant([[1, 2, 3, 4], [5, 6, 0, 0]])
    pads = tf.constant([[0, 0, 0, 0], [0, 0, 1, 1]], tf.float32)
    logits, out_pads = lm.FProp(ids, pads)
    self.assertEqual(logits.shape, (2, 4, vocab))
    self.assertIs(out_pads, pads)
    meta = core.SequentialLayer.FPropMeta(stack, (2, 4), (2, 4))
    self.assertEqual(meta.out_shapes, ((2, 4, vocab), (2, 4)))
    self.assertEqual(meta.num_params, lm.NumParams())
    # Changing a padded id changes no unpadded logit.
    logits2, _ = lm.FProp(tf.constant([[1, 2, 3, 4], [5, 6, 9, 9]]), pads)
    self.assertAllClose(logits[1, :2], logits2[1, :2], atol=1e-5)
    self.assertNotAllClose(logits[1, 2:], logits2[1, 2:])
    self.assertAllClose(
        lm.layers[1].ffn.fc2.w.numpy() * math.sqrt(2.0),
        block.Copy().Set(name='dec0', ffn_init_scale_by_num_layers=0)
        .Instantiate(parent_path='lm').ffn.fc2.w, atol=1e-6)


if __name__ == '__main__':
  tf.test.main()
