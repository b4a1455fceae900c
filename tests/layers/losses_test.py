"""Tests for gpipe_tf.layers.losses: cross-entropy, clipping, accuracy."""


import numpy as np
import tensorflow as tf


from gpipe_tf.layers import base_layer  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import losses


def _NpLogSoftmax(logits):
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


class SoftmaxCrossEntropyTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.RandomState(6)
    self.logits = (4.0 * rng.randn(2, 3, 5)).astype(np.float32)
    self.labels = rng.randint(0, 5, size=(2, 3)).astype(np.int32)

  def _NpNll(self, logits):
    log_probs = _NpLogSoftmax(logits.astype(np.float64))
    return -np.take_along_axis(log_probs, self.labels[..., None], -1)[..., 0]

  def testMatchesNumpy(self):
    loss = losses.SoftmaxCrossEntropy(self.logits, self.labels)
    self.assertEqual(loss.shape, (2, 3))
    self.assertEqual(loss.dtype, tf.float32)
    self.assertAllClose(self._NpNll(self.logits), loss, atol=1e-5)

  def testLabelSmoothingMatchesHandFormula(self):
    s, c = 0.2, 5
    targets = np.full(self.logits.shape, s / c)
    np.put_along_axis(targets, self.labels[..., None], 1.0 - s + s / c, -1)
    expected = -(targets * _NpLogSoftmax(self.logits.astype(np.float64))).sum(
        -1)
    loss = losses.SoftmaxCrossEntropy(self.logits, self.labels,
                                      label_smoothing=s)
    self.assertAllClose(expected, loss, atol=1e-5)
    self.assertNotAllClose(self._NpNll(self.logits), loss)

  def testLogitsClip(self):
    clip = 3.0
    clipped = clip * np.tanh(self.logits / clip)
    loss = losses.SoftmaxCrossEntropy(self.logits, self.labels,
                                      logits_clip=clip)
    self.assertAllClose(self._NpNll(clipped), loss, atol=1e-5)
    self.assertNotAllClose(self._NpNll(self.logits), loss)
    self.assertAllClose(clipped, losses.ClipLogits(self.logits, clip),
                        atol=1e-6)
    self.assertLessEqual(float(tf.reduce_max(tf.abs(
        losses.ClipLogits(tf.constant([1e4, -1e4]), clip)))), clip)

  def testBfloat16LogitsGiveFloat32Loss(self):
    logits = tf.constant(self.logits, tf.bfloat16)
    loss = losses.SoftmaxCrossEntropy(logits, self.labels)
    self.assertEqual(loss.dtype, tf.float32)
    self.assertAllClose(
        self._NpNll(tf.cast(logits, tf.float32).numpy()), loss, atol=1e-5)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, 'label_smoothing'):
      losses.SoftmaxCrossEntropy(self.logits, self.labels, label_smoothing=1.)
    with self.assertRaisesRegex(ValueError, 'logits_clip'):
      losses.SoftmaxCrossEntropy(self.logits, self.labels, logits_clip=0.0)
    with self.assertRaisesRegex(ValueError, 'integer'):
      losses.SoftmaxCrossEntropy(self.logits, self.labels.astype(np.float32))
    with self.assertRaisesRegex(ValueError, 'do not match'):
      losses.SoftmaxCrossEntropy(self.logits, self.labels[:, :2])


class AccuracyTest(tf.test.TestCase):

  def testTopKAndWeights(self):
    logits = tf.constant([[0.1, 0.7, 0.2], [0.5, 0.1, 0.4], [0.3, 0.3, 0.4],
                          [0.9, 0.05, 0.05]])
    labels = tf.constant([1, 2, 0, 2])
    self.assertAllClose(0.25, losses.Accuracy(logits, labels))
    # Row 2 ties classes 0 and 1: the lower id (the label, 0) wins.
    self.assertAllClose(0.75, losses.Accuracy(logits, labels, top_k=2))
    self.assertAllClose(1.0, losses.Accuracy(logits, labels, top_k=3))
    weights = tf.constant([1.0, 1.0, 0.0, 0.0])
    self.assertAllClose(0.5, losses.Accuracy(logits, labels, weights=weights))
    self.assertAllClose(1.0, losses.Accuracy(logits, labels, top_k=2,
                                             weights=weights))
    self.assertAllClose(0.0, losses.Accuracy(logits, labels,
                                             weights=tf.zeros([4])))
    with self.assertRaisesRegex(ValueError, 'top_k'):
      losses.Accuracy(logits, labels, top_k=4)

  def testSequenceLabels(self):
    logits = tf.one_hot([[1, 2], [0, 0]], 3)
    self.assertAllClose(0.75, losses.Accuracy(logits, [[1, 2], [0, 1]]))


class SoftmaxLayerTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.RandomState(7)
    self.p = losses.SoftmaxLayer.Params().Set(name='softmax', input_dim=4,
                                              num_classes=6)
    self.x = rng.randn(3, 2, 4).astype(np.float32)
    self.labels = rng.randint(0, 6, size=(3, 2))

  def testLogitsAndLoss(self):
    p = self.p.Copy().Set(logits_clip=2.0, label_smoothing=0.1)
    layer = p.Instantiate()
    layer.b.assign(np.arange(6, dtype=np.float32) / 6)
    logits = layer.FProp(tf.constant(self.x))
    raw = self.x @ layer.w.numpy() + layer.b.numpy()
    self.assertAllClose(2.0 * np.tanh(raw / 2.0), logits, atol=1e-5)
    self.assertAllClose(
        losses.SoftmaxCrossEntropy(raw, self.labels, label_smoothing=0.1,
                                   logits_clip=2.0),
        layer.Loss(logits, self.labels), atol=1e-5)

  def testMetaGradientsPassthrough(self):
    layer = self.p.Instantiate()
    pads = tf.zeros([3, 2])
    with tf.GradientTape() as tape:
      logits, out_pads = layer.FProp(tf.constant(self.x), pads)
      loss = tf.reduce_mean(layer.Loss(logits, self.labels))
    self.assertIs(out_pads, pads)
    grads = tape.gradient(loss, layer.trainable_variables)
    self.assertLen(grads, 2)
    for g in grads:
      self.assertIsNotNone(g)
    meta = losses.SoftmaxLayer.FPropMeta(self.p, (3, 2, 4), (3, 2))
    self.assertEqual(meta.out_shapes, ((3, 2, 6), (3, 2)))
    self.assertEqual(meta.num_params, layer.NumParams())
    self.assertEqual(meta.flops, 3 * 2 * 6 * (2 * 4 + 1))
    with self.assertRaisesRegex(base_layer.LayerInputError, "'softmax'"):
      layer.FProp(tf.zeros([3, 5]))
    for kw in (dict(num_classes=0), dict(logits_clip=-1.0),
               dict(label_smoothing=1.0)):
      with self.assertRaisesRegex(ValueError, "'bad'"):
        self.p.Copy().Set(name='bad', **kw).Instantiate()


if __name__ == '__main__':
  tf.test.main()
