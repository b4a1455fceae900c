"""Tests of gpipe_tf.tasks.metrics: BLEU against hand-computed values, accuracies, DecodeBleu."""

import os
import tempfile

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from gpipe_tf.tasks import metrics  # pylint: disable=g-import-not-at-top
from gpipe_tf.data import text_inputs  # pylint: disable=g-import-not-at-top


class CorpusBleuTest(tf.test.TestCase):

  def testIdenticalCorpusIs100(self):
    refs = ['the cat sat on the mat', 'a dog barked twice at the moon']
    self.assertAlmostEqual(metrics.CorpusBleu(refs, refs), 100.0, places=6)

  def testKnownPrecisions(self):
    # One wrong last word of six: n-gram precisions 5/6, 4/5, 3/4, 2/3, no
    # brevity penalty; their geometric mean is (1/3)^(1/4).
    bleu = metrics.CorpusBleu(['a b c d e f'], ['a b c d e g'])
    self.assertAlmostEqual(bleu, 100.0 * 3.0**-0.25, places=4)

  def testBrevityPenalty(self):
    # All n-grams right but 4 words for 6: penalty exp(1 - 6/4).
    bleu = metrics.CorpusBleu(['a b c d'], ['a b c d e f'])
    self.assertAlmostEqual(bleu, 100.0 * np.exp(-0.5), places=4)

  def testCorpusLevelNotSentenceAverage(self):
    # One perfect and one disjoint 5-word sentence: n-gram counts are pooled
    # over the corpus (5/10, 4/8, 3/6, 2/4), not averaged per sentence.
    bleu = metrics.CorpusBleu(['a b c d e', 'v w x y z'],
                              ['a b c d e', 'p q r s t'])
    expected = 100.0 * (5 / 10 * 4 / 8 * 3 / 6 * 2 / 4)**0.25
    self.assertAlmostEqual(bleu, expected, places=4)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, 'one reference'):
      metrics.CorpusBleu(['a'], ['a', 'b'])
    with self.assertRaisesRegex(ValueError, 'empty'):
      metrics.CorpusBleu([], [])


class AccuracyTest(tf.test.TestCase):

  def testTokenAccuracyIgnoresPaddings(self):
    logits = tf.one_hot([[1, 2, 3], [0, 0, 0]], 4) * 5.0
    labels = tf.constant([[1, 2, 0], [0, 3, 3]])
    paddings = tf.constant([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    # Unpadded: (1,1), (2,2), (0,0), (0 vs 3): 3 of 4 right.
    self.assertAllClose(metrics.TokenAccuracy(logits, labels, paddings), 0.75)
    self.assertAllClose(
        metrics.TokenAccuracy(logits, labels, paddings, top_k=4), 1.0)

  def testSequenceAccuracy(self):
    labels = tf.constant([[5, 6, 2, 0], [5, 6, 2, 0], [7, 2, 0, 0]])
    predictions = tf.constant([[5, 6, 2, 9], [5, 7, 2, 0], [7, 2, 4, 4]])
    paddings = tf.cast(tf.equal(labels, 0), tf.float32)
    self.assertAllClose(
        metrics.SequenceAccuracy(predictions, labels, paddings), 2.0 / 3.0)


class DecodeBleuTest(tf.test.TestCase):

  def testPerfectAndImperfectDecoders(self):
    folder = os.path.join(tempfile.mkdtemp(), 'corpus')
    text_inputs.WriteReversalCorpus(folder, 100, 20, seed=0)
    gen = text_inputs.ParallelTextInput.Params().Set(
        folder=folder, split='test', build_vocab=True, vocab_size=120,
        max_length=20, batch_size=8, shuffle=False, repeat=False,
        drop_remainder=False).Instantiate()
    batches = list(gen.GetDataset())
    perfect = metrics.DecodeBleu(lambda b: b['tgt_labels'], batches,
                                 gen.vocab)
    self.assertAlmostEqual(perfect.bleu, 100.0, places=6)
    self.assertEqual(perfect.exact_match, 1.0)
    self.assertLen(perfect.hypotheses, 20)
    with open(os.path.join(folder, 'test.en-rev.rev')) as f:
      self.assertEqual(perfect.references, f.read().splitlines())
    # Echoing the source (minus its <2rev> token) is the un-reversed text.
    echo = metrics.DecodeBleu(lambda b: b['src_ids'][:, 1:], batches,
                              gen.vocab, max_batches=2)
    self.assertLen(echo.hypotheses, 16)
    self.assertLess(echo.bleu, 60.0)
    self.assertLess(echo.exact_match, 0.2)
    with self.assertRaisesRegex(ValueError, 'no batch'):
      metrics.DecodeBleu(lambda b: b['tgt_labels'], [], gen.vocab)


if __name__ == '__main__':
  tf.test.main()
