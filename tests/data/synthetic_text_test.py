"""Tests of gpipe_tf.data.synthetic_text: the LM and translation batches are what they claim."""

import tensorflow as tf

from gpipe_tf.data import inputs
from gpipe_tf.data import synthetic_text
from gpipe_tf.data import vocab as vocab_lib


class SyntheticTextTest(tf.test.TestCase):

  def testTokenInput(self):
    p = synthetic_text.SyntheticTokenInput.Params().Set(
        vocab_size=50, seq_len=7, min_length=4, num_examples=6, batch_size=3,
        shuffle=False)
    batch = next(iter(p.Instantiate().GetDataset()))
    ids, labels, pad = (batch[k].numpy() for k in ('ids', 'labels', 'paddings'))
    keep = pad == 0
    self.assertTrue(keep[:, :4].all())
    self.assertAllEqual(ids[:, 1:][keep[:, 1:]], labels[:, :-1][keep[:, 1:]])
    self.assertTrue((ids[keep] >= 3).all() and (ids[keep] < 50).all())
    self.assertTrue((ids[~keep] == 0).all())

  def testTranslationInputReverses(self):
    p = synthetic_text.SyntheticTranslationInput.Params().Set(
        vocab_size=30, src_len=6, tgt_len=7, num_examples=5, batch_size=5,
        shuffle=False)
    b = {k: v.numpy() for k, v in next(iter(p.Instantiate().GetDataset()))
         .items()}
    for i in range(5):
      n = int((b['src_paddings'][i] == 0).sum()) - 1  # Tokens before EOS.
      src = b['src_ids'][i]
      self.assertEqual(src[n], vocab_lib.EOS_ID)
      self.assertAllEqual(b['tgt_labels'][i, :n], src[:n][::-1])
      self.assertEqual(b['tgt_labels'][i, n], vocab_lib.EOS_ID)
      self.assertEqual(b['tgt_ids'][i, 0], vocab_lib.BOS_ID)
      self.assertAllEqual(b['tgt_ids'][i, 1:n + 1], b['tgt_labels'][i, :n])
      self.assertEqual((b['tgt_paddings'][i] == 0).sum(), n + 1)


  def testBadParamsAreInputConfigErrors(self):
    with self.assertRaisesRegex(inputs.InputConfigError, 'vocab_size > 3'):
      synthetic_text.SyntheticTokenInput.Params().Set(
          vocab_size=3).Instantiate()
    with self.assertRaisesRegex(inputs.InputConfigError, 'min_length'):
      synthetic_text.SyntheticTokenInput.Params().Set(
          seq_len=4, min_length=5).Instantiate()
    with self.assertRaisesRegex(inputs.InputConfigError,
                                'min_length < src_len <= tgt_len'):
      synthetic_text.SyntheticTranslationInput.Params().Set(
          src_len=8, tgt_len=4).Instantiate()

  def testSameSeedSameData(self):
    p = synthetic_text.SyntheticTokenInput.Params().Set(
        vocab_size=20, seq_len=5, num_examples=4, batch_size=4, noise=0.5,
        shuffle=False, data_seed=3)
    first = next(iter(p.Instantiate().GetDataset()))['ids'].numpy()
    again = next(iter(p.Instantiate().GetDataset()))['ids'].numpy()
    other = next(iter(p.Copy().Set(data_seed=4).Instantiate().GetDataset()))
    self.assertAllEqual(first, again)
    self.assertNotAllEqual(first, other['ids'].numpy())


if __name__ == '__main__':
  tf.test.main()
