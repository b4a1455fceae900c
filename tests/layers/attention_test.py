"""Tests for gpipe_tf.layers.attention vs a NumPy softmax(QK^T/sqrt(d))V."""


import numpy as np
import tensorflow as tf


from gpipe_tf.layers import attention  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import random_seeds

MHA = attention.MultiHeadAttention


def _Fc(fc, x):
  y = x @ fc.w.numpy().astype(np.float32)
  return y + fc.b.numpy().astype(np.float32) if fc.p.has_bias else y


def _NpAttention(layer, query, key_value=None, paddings=None, causal=False):
  """Reference multi-head attention; masked keys get probability exactly 0."""
  key_value = query if key_value is None else key_value
  n = layer.p.num_heads

  def Heads(x):  # [B, T, N*H] -> [B, N, T, H]
    b, t, d = x.shape
    return x.reshape(b, t, n, d // n).transpose(0, 2, 1, 3)

  q, k, v = (Heads(_Fc(layer.query, query)), Heads(_Fc(layer.key, key_value)),
             Heads(_Fc(layer.value, key_value)))
  logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
  t, s = logits.shape[2:]
  mask = np.zeros(logits.shape, bool)
  if paddings is not None:
    mask |= paddings[:, None, None, :] > 0.5
  if causal:
    mask |= np.triu(np.ones((t, s), bool), k=1)
  logits = np.where(mask, -np.inf, logits)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  context = (probs @ v).transpose(0, 2, 1, 3)
  return _Fc(layer.post, context.reshape(context.shape[:2] + (-1,)))


class MultiHeadAttentionTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.RandomState(3)
    self.p = MHA.Params().Set(name='atten', input_dim=6, hidden_dim=8,
                              num_heads=2)
    self.x = self.rng.randn(2, 5, 6).astype(np.float32)
    self.kv = self.rng.randn(2, 4, 6).astype(np.float32)
    self.kv_paddings = np.array([[0, 0, 0, 1], [0, 0, 1, 1]], np.float32)
    self.x_paddings = np.array([[0, 0, 0, 0, 1], [0, 0, 0, 1, 1]], np.float32)

  def testSelfAttentionMatchesNumpy(self):
    layer = self.p.Instantiate()
    y = layer.FProp(tf.constant(self.x), None, tf.constant(self.x_paddings))
    self.assertAllClose(_NpAttention(layer, self.x, None, self.x_paddings), y,
                        atol=1e-5)
    y = layer.FProp(tf.constant(self.x))
    self.assertAllClose(_NpAttention(layer, self.x), y, atol=1e-5)

  def testCrossAttentionMatchesNumpy(self):
    p = self.p.Copy().Set(hidden_dim=0, num_heads=3, use_bias=False)
    layer = p.Instantiate()
    self.assertEqual(layer.query.w.shape, (6, 6))
    y = layer.FProp(tf.constant(self.x), tf.constant(self.kv),
                    tf.constant(self.kv_paddings))
    self.assertEqual(y.shape, (2, 5, 6))
    self.assertAllClose(
        _NpAttention(layer, self.x, self.kv, self.kv_paddings), y, atol=1e-5)

  def testCausalMatchesNumpyAndHidesTheFuture(self):
    layer = self.p.Instantiate()
    y = layer.FProp(tf.constant(self.x), causal=True)
    self.assertAllClose(_NpAttention(layer, self.x, causal=True), y,
                        atol=1e-5)
    changed = self.x.copy()
    changed[:, 3:] += 10.0
    y2 = layer.FProp(tf.constant(changed), causal=True)
    self.assertAllClose(y[:, :3], y2[:, :3], atol=1e-6)
    self.assertNotAllClose(y[:, 3], y2[:, 3])
    # Without the causal mask the past does see the change.
    self.assertNotAllClose(layer.FProp(tf.constant(self.x))[:, :3],
                           layer.FProp(tf.constant(changed))[:, :3])

  def testPaddedKeysAreIgnored(self):
    layer = self.p.Instantiate()
    changed = self.kv.copy()
    changed[self.kv_paddings > 0] = 100.0
    pads = tf.constant(self.kv_paddings)
    y = layer.FProp(tf.constant(self.x), tf.constant(self.kv), pads)
    y2 = layer.FProp(tf.constant(self.x), tf.constant(changed), pads)
    self.assertAllClose(y, y2, atol=1e-6)
    self.assertNotAllClose(
        y, layer.FProp(tf.constant(self.x), tf.constant(changed)))

  def testAttentionDropoutIsSeededAndTrainingOnly(self):
    layer = self.p.Copy().Set(atten_dropout_prob=0.5).Instantiate()
    x = tf.constant(self.x)
    seed = tf.constant([7, 11], tf.int64)
    with random_seeds.StepSeedScope(seed):
      a = layer.FProp(x, training=True)
    with random_seeds.StepSeedScope(seed):
      b = layer.FProp(x, training=True)
    self.assertAllEqual(a, b)
    eval_out = layer.FProp(x)
    self.assertAllClose(_NpAttention(layer, self.x), eval_out, atol=1e-5)
    self.assertNotAllClose(a, eval_out)

  def testMetaMatchesLayer(self):
    for key_shape, kv in ((None, None), (self.kv.shape, self.kv)):
      for use_bias in (True, False):
        p = self.p.Copy().Set(use_bias=use_bias)
        layer = p.Instantiate()
        y = layer.FProp(tf.constant(self.x),
                        None if kv is None else tf.constant(kv))
        meta = MHA.FPropMeta(p, self.x.shape, key_shape)
        self.assertEqual(meta.out_shapes, (tuple(y.shape.as_list()),))
        self.assertEqual(meta.num_params, layer.NumParams())
        self.assertEqual(meta.num_params,
                         4 * 6 * 8 + use_bias * (3 * 8 + 6))
    # Projections 2*B*(T*3)*D*H... at least the four matmuls plus attention.
    self_meta = MHA.FPropMeta(self.p, (2, 5, 6))
    self.assertGreaterEqual(self_meta.flops,
                            2 * 2 * 5 * 6 * 8 * 4 + 2 * 2 * 2 * 5 * 5 * 8)
    self.assertEqual(MHA.FPropMeta(self.p, (None, 5, 6)).out_shapes,
                     ((None, 5, 6),))

  def testGradientsReachAllVariables(self):
    layer = self.p.Instantiate()
    with tf.GradientTape() as tape:
      y = layer.FProp(tf.constant(self.x), tf.constant(self.kv),
                      tf.constant(self.kv_paddings), training=True)
      loss = tf.reduce_sum(y * tf.constant(self.rng.randn(2, 5, 6),
                                           tf.float32))
    grads = tape.gradient(loss, layer.trainable_variables)
    self.assertLen(grads, 8)
    for v, g in zip(layer.trainable_variables, grads):
      self.assertIsNotNone(g, v.name)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, "'bad'.*divide"):
      self.p.Copy().Set(name='bad', num_heads=3).Instantiate()
    with self.assertRaisesRegex(ValueError, 'divide'):
      MHA.FPropMeta(self.p.Copy().Set(num_heads=3), (2, 5, 6))
    with self.assertRaises(ValueError):
      self.p.Copy().Set(atten_dropout_prob=1.0).Instantiate()
    layer = self.p.Instantiate()
    with self.assertRaisesRegex(base_layer.LayerInputError, "'atten'"):
      layer.FProp(tf.zeros([2, 5, 7]))
    with self.assertRaisesRegex(base_layer.LayerInputError, 'key_value'):
      layer.FProp(tf.zeros([2, 5, 6]), tf.zeros([2, 5, 4]))
    with self.assertRaisesRegex(base_layer.LayerInputError, 'paddings'):
      layer.FProp(tf.zeros([2, 5, 6]), None, tf.zeros([2, 5, 1]))
    with self.assertRaises(base_layer.LayerInputError):
      layer.FProp(tf.zeros([5, 6]))
    with self.assertRaises(base_layer.LayerInputError):
      MHA.FPropMeta(self.p, (2, 5, 7))

  def testTfFunctionWithUnknownBatchAndTime(self):
    layer = self.p.Instantiate()
    spec = tf.TensorSpec([None, None, 6], tf.float32)

    @tf.function(input_signature=[spec, tf.TensorSpec([None, None])])
    def Run(x, paddings):
      return layer.FProp(x, None, paddings, causal=True)

    y = Run(tf.constant(self.x), tf.constant(self.x_paddings))
    self.assertAllClose(
        _NpAttention(layer, self.x, None, self.x_paddings, causal=True), y,
        atol=1e-5)

  def testBfloat16SoftmaxInFloat32(self):
    layer = self.p.Copy().Set(dtype='bfloat16').Instantiate()
    x = tf.constant(self.x, tf.bfloat16)
    y = layer.FProp(x, None, tf.constant(self.x_paddings))
    self.assertEqual(y.dtype, tf.bfloat16)
    x32 = tf.cast(x, tf.float32).numpy()
    self.assertAllClose(_NpAttention(layer, x32, None, self.x_paddings),
                        tf.cast(y, tf.float32), atol=0.1, rtol=0.05)


if __name__ == '__main__':
  tf.test.main()
