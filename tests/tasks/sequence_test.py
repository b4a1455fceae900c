"""Tests of gpipe_tf.tasks.sequence: token losses over unpadded positions and greedy decoding."""

import numpy as np
import tensorflow as tf

from gpipe_tf import tasks
from gpipe_tf.layers import base_layer
from gpipe_tf.tasks import sequence


class FixedLogits(base_layer.BaseLayer):
  """Returns Params.logits [B, T, V] whatever its inputs (plus 0 * w)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('logits', [[[0.0]]], 'Logits [B, T, V] returned for any input.')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    self.CreateVariable('w', [1])

  def FProp(self, *inputs, training=False):
    del inputs, training
    return tf.constant(self.p.logits, tf.float32) + 0.0 * self.w


class CopyNextSource(base_layer.BaseLayer):
  """A 'translator' whose logits at position t pick src_ids[:, t].

  With Decode's greedy argmax it outputs the source sentence, so a test
  knows the translation beforehand.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 8, 'Vocabulary size.')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    self.CreateVariable('w', [1])

  def FProp(self, src_ids, src_paddings, tgt_ids, tgt_paddings,
            training=False):
    del src_paddings, tgt_paddings, training
    t = tgt_ids.shape[1]
    src = tf.pad(src_ids, [[0, 0], [0, max(0, t - src_ids.shape[1])]],
                 constant_values=sequence.EOS_ID)[:, :t]
    return 10.0 * tf.one_hot(src, self.p.vocab_size) + 0.0 * self.w


def _LogSoftmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


_LOGITS = [[[2.0, 0.5, -1.0], [0.0, 1.0, 3.0], [1.0, 1.0, 1.0]],
           [[0.3, 0.2, 0.1], [5.0, 0.0, 0.0], [0.0, 0.0, 4.0]]]
_LABELS = np.array([[0, 1, 2], [2, 0, 1]], np.int32)
_PADDINGS = np.array([[0, 0, 1], [0, 0, 0]], np.float32)  # 5 real tokens.


def _LmBatch():
  return {'ids': np.zeros([2, 3], np.int32), 'labels': _LABELS,
          'paddings': _PADDINGS}


class LanguageModelTaskTest(tf.test.TestCase):

  def _Task(self, **kwargs):
    return tasks.LanguageModelTask.Params().Set(
        model=FixedLogits.Params().Set(logits=_LOGITS), **kwargs
    ).Instantiate()

  def testLossIsTheMeanOverUnpaddedTokens(self):
    loss, metrics = self._Task().ComputeLoss(_LmBatch())
    nll = -np.take_along_axis(_LogSoftmax(_LOGITS), _LABELS[..., None],
                              -1)[..., 0]
    weights = 1.0 - _PADDINGS
    expected = (nll * weights).sum() / weights.sum()
    self.assertAllClose(loss, expected, rtol=1e-6)
    self.assertAllClose(metrics['log_pplx'], expected, rtol=1e-6)
    # argmax per position: [0, 2, 0] and [0, 0, 2]; right on (0,0), (1,1).
    self.assertAllClose(metrics['accuracy'], 2 / 5)
    self.assertAllClose(metrics['num_tokens'], 2.5)  # 5 tokens, 2 rows.

  def testPaddedPositionsDoNotCount(self):
    changed = [list(map(list, row)) for row in _LOGITS]
    changed[0][2] = [-9.0, 9.0, -9.0]  # Position (0, 2) is padding.
    task = tasks.LanguageModelTask.Params().Set(
        model=FixedLogits.Params().Set(logits=changed)).Instantiate()
    a, _ = self._Task().ComputeLoss(_LmBatch())
    b, _ = task.ComputeLoss(_LmBatch())
    self.assertAllClose(a, b)

  def testLabelSmoothingMixesInTheUniformLoss(self):
    smooth, metrics = self._Task(label_smoothing=0.2).ComputeLoss(_LmBatch())
    log_p = _LogSoftmax(_LOGITS)
    nll = -np.take_along_axis(log_p, _LABELS[..., None], -1)[..., 0]
    per_token = 0.8 * nll + 0.2 * -log_p.mean(-1)
    weights = 1.0 - _PADDINGS
    self.assertAllClose(smooth, (per_token * weights).sum() / weights.sum(),
                        rtol=1e-6)
    # The perplexity metric stays the unsmoothed one.
    self.assertAllClose(metrics['log_pplx'],
                        (nll * weights).sum() / weights.sum(), rtol=1e-6)

  def testBadLabelSmoothingIsAConfigError(self):
    with self.assertRaisesRegex(base_layer.LayerConfigError,
                                r'label_smoothing must be in \[0, 1\)'):
      self._Task(label_smoothing=1.0)


class TranslationTaskTest(tf.test.TestCase):

  def _Task(self):
    return tasks.TranslationTask.Params().Set(
        model=CopyNextSource.Params()).Instantiate()

  def testDefaultsSmoothAndUseTheVocabularysIds(self):
    p = tasks.TranslationTask.Params()
    self.assertEqual(p.label_smoothing, 0.1)
    self.assertEqual((p.bos_id, p.eos_id, p.pad_id),
                     (sequence.BOS_ID, sequence.EOS_ID, sequence.PAD_ID))

  def testDecodeStopsEachRowAtItsEosThenPads(self):
    eos, pad = sequence.EOS_ID, sequence.PAD_ID
    src = np.array([[5, 6, eos, 7, 7], [4, 4, 4, 4, 4]], np.int32)
    out = self._Task().Decode(
        {'src_ids': src, 'src_paddings': np.zeros([2, 5], np.float32)},
        max_len=6)
    # Row 0 stops at its EOS; row 1 has none and runs to max_len (the model
    # reads EOS past the source's end).
    self.assertAllEqual(out, [[5, 6, eos, pad, pad, pad],
                              [4, 4, 4, 4, 4, eos]])

  def testDecodeNeedsAPositiveLength(self):
    with self.assertRaisesRegex(ValueError, 'max_len must be >= 1'):
      self._Task().Decode({'src_ids': np.zeros([1, 2], np.int32),
                           'src_paddings': np.zeros([1, 2], np.float32)}, 0)


if __name__ == '__main__':
  tf.test.main()
