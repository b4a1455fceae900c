"""Tests of gpipe_tf.tasks.sequence: token losses over unpadded positions, label smoothing and greedy decoding."""

import test_utils  # pylint: disable=g-bad-import-order

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import base_layer  # pylint: disable=g-import-not-at-top
from gpipe_tf.tasks import sequence  # pylint: disable=g-import-not-at-top


class _FixedLogits(base_layer.BaseLayer):
  """Stand-in model: returns Params.logits (+ 0 * w) and its last input."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('logits', None, 'Nested list [B, T, V].')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    self.CreateVariable('w', [1])

  def FProp(self, *inputs, training=False):
    return tf.constant(self.p.logits, tf.float32) + 0.0 * self.w, inputs[-1]


class _CountUp(base_layer.BaseLayer):
  """Translation stand-in: predicts tgt_ids[t] + src_ids[0] at position t."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 32, 'V.')
    return p

  def FProp(self, src, src_pad, tgt, tgt_pad, training=False):
    nxt = (tgt + src[:, :1]) % self.p.vocab_size
    return tf.one_hot(nxt, self.p.vocab_size) * 5.0, tgt_pad


def _LanguageModel(logits):
  return sequence.LanguageModelTask.Params().Set(
      model=_FixedLogits.Params().Set(logits=logits)).Instantiate()


class SequenceTasksTest(tf.test.TestCase):

  def testLanguageModelLossIgnoresPadding(self):
    logits = np.random.default_rng(0).normal(size=[2, 3, 5]).tolist()
    labels = np.array([[1, 2, 3], [4, 0, 2]], np.int32)
    paddings = np.array([[0, 0, 0], [0, 0, 1]], np.float32)
    task = _LanguageModel(logits)
    loss, metrics = task.ComputeLoss({'ids': labels, 'labels': labels,
                                      'paddings': paddings})
    nll = -np.take_along_axis(test_utils.LogSoftmax(logits),
                              labels[..., None], -1)[..., 0]
    keep = paddings == 0
    self.assertAllClose(loss, nll[keep].mean(), rtol=1e-5)
    self.assertAllClose(metrics['log_pplx'], nll[keep].mean(), rtol=1e-5)
    hits = np.argmax(logits, -1) == labels
    self.assertAllClose(metrics['accuracy'], hits[keep].mean())
    self.assertAllClose(metrics['num_tokens'], 2.5)

  def testLogitsAtPaddedPositionsDoNotCount(self):
    logits = np.random.default_rng(2).normal(size=[2, 3, 4])
    changed = logits.copy()
    changed[1, 2] = [-9.0, 9.0, -9.0, 9.0]  # Position (1, 2) is padding.
    batch = {'ids': np.zeros([2, 3], np.int32),
             'labels': np.array([[0, 1, 2], [2, 0, 1]], np.int32),
             'paddings': np.array([[0, 0, 0], [0, 0, 1]], np.float32)}
    a, _ = _LanguageModel(logits.tolist()).ComputeLoss(batch)
    b, _ = _LanguageModel(changed.tolist()).ComputeLoss(batch)
    self.assertAllClose(a, b)

  def testTranslationLabelSmoothing(self):
    logits = np.random.default_rng(1).normal(size=[1, 2, 4]).tolist()
    labels = np.array([[3, 1]], np.int32)
    model = _FixedLogits.Params().Set(logits=logits)
    task = sequence.TranslationTask.Params().Set(
        model=model, label_smoothing=0.2).Instantiate()
    loss, metrics = task.ComputeLoss({
        'src_ids': labels, 'src_paddings': np.zeros([1, 2], np.float32),
        'tgt_ids': labels, 'tgt_labels': labels,
        'tgt_paddings': np.zeros([1, 2], np.float32)})
    log_p = test_utils.LogSoftmax(logits)[0]
    nll = -log_p[[0, 1], labels[0]]
    want = (0.8 * nll - 0.2 * log_p.mean(-1)).mean()
    self.assertAllClose(loss, want, rtol=1e-5)
    self.assertAllClose(metrics['log_pplx'], nll.mean(), rtol=1e-5)
    with self.assertRaisesRegex(base_layer.LayerConfigError,
                                r'label_smoothing must be in \[0, 1\)'):
      sequence.TranslationTask.Params().Set(
          model=model, label_smoothing=1.0).Instantiate()

  def testTranslationDefaultsSmoothAndUseTheVocabularysIds(self):
    p = sequence.TranslationTask.Params()
    self.assertEqual(p.label_smoothing, 0.1)
    self.assertEqual((p.bos_id, p.eos_id, p.pad_id),
                     (sequence.BOS_ID, sequence.EOS_ID, sequence.PAD_ID))

  def testGreedyDecodeFeedsBackAndStopsAtEos(self):
    task = sequence.TranslationTask.Params().Set(
        model=_CountUp.Params(), bos_id=3, eos_id=6, pad_id=0).Instantiate()
    batch = {'src_ids': tf.constant([[1, 9], [2, 9]]),
             'src_paddings': tf.zeros([2, 2])}
    ids = task.Decode(batch, max_len=5)
    # Row 0 counts 4, 5, 6 (EOS) then pads; row 1 skips 6 and never stops.
    self.assertAllEqual(ids, [[4, 5, 6, 0, 0], [5, 7, 9, 11, 13]])
    self.assertAllEqual(tf.function(lambda b: task.Decode(b, 5))(batch), ids)
    with self.assertRaisesRegex(ValueError, 'max_len must be >= 1'):
      task.Decode(batch, max_len=0)


if __name__ == '__main__':
  tf.test.main()
