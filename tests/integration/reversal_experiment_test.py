"""Tests of params/mt/reversal.py: registration, corpus on first use, a short pipelined run scored with BLEU."""

import os
import tempfile

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.train import checkpoints  # pylint: disable=g-import-not-at-top
from gpipe_tf import model_registry  # pylint: disable=g-import-not-at-top
from gpipe_tf.tasks import sequence  # pylint: disable=g-import-not-at-top
from gpipe_tf.data import text_inputs  # pylint: disable=g-import-not-at-top
from gpipe_tf.train import loop  # pylint: disable=g-import-not-at-top
from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
from params.mt import reversal  # pylint: disable=g-import-not-at-top


class _Small(reversal.TinyTransformer):
  """TinyTransformer cut down so that tracing one step is quick."""

  NUM_TRAIN = 400
  NUM_TEST = 16
  BATCH_SIZE = 8
  NUM_LAYERS = 1
  MODEL_DIM = 32
  HIDDEN_DIM = 64
  NUM_MICRO_BATCHES = 2

  def Train(self):
    return super().Train().Set(bucket_boundaries=[])  # One shape: one trace.


class _Fresh(_Small):
  """A corpus of its own, so that no other test has written it yet."""

  NUM_TEST = 12


class ReversalExperimentTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Corpora go to a scratch directory, not the shared default DATA_ROOT.
    cls._data_root = reversal.DATA_ROOT
    reversal.DATA_ROOT = tempfile.mkdtemp()

  @classmethod
  def tearDownClass(cls):
    reversal.DATA_ROOT = cls._data_root
    super().tearDownClass()

  def testRegisteredAndBuilds(self):
    self.assertIs(model_registry.GetClass('mt.reversal.TinyTransformer'),
                  reversal.TinyTransformer)
    self.assertIs(model_registry.GetClass('mt.reversal.TinyMultilingual'),
                  reversal.TinyMultilingual)
    params = model_registry.GetParams('mt.reversal.TinyTransformer')
    self.assertEqual(params.task.cls, sequence.TranslationTask)
    self.assertEqual(params.task.model.cls, PipeliningLayer)
    task = params.task.Instantiate()
    self.assertLen(task.model.balance, 2)
    self.assertLen(set(task.model.devices), 2)
    self.assertEqual(params.train.folder, params.test.folder)
    self.assertTrue(params.train.folder.startswith(reversal.DATA_ROOT))

  def testCorpusWrittenOnFirstUseAndIdempotent(self):
    params = _Fresh().ExperimentParams()
    folder = params.train.folder
    self.assertFalse(os.path.exists(folder))
    train = params.train.Instantiate()
    self.assertEqual(train.NumExamples(), _Fresh.NUM_TRAIN)
    files = sorted(os.listdir(folder))
    self.assertIn('vocab.model', files)
    self.assertIn('train.en-rev.en', files)
    stamps = {f: os.stat(os.path.join(folder, f)).st_mtime_ns for f in files}
    test = params.test.Instantiate()  # Same folder: nothing is rewritten.
    self.assertEqual(test.NumExamples(), _Fresh.NUM_TEST)
    text_inputs.WriteReversalCorpus(folder, _Fresh.NUM_TRAIN, _Fresh.NUM_TEST,
                                    languages=('rev',))
    self.assertEqual(
        {f: os.stat(os.path.join(folder, f)).st_mtime_ns for f in files},
        stamps)
    self.assertLessEqual(train.vocab.vocab_size, _Fresh.VOCAB_SIZE)

  def testOneStepTrainsAndDecodesToBleu(self):
    logdir = tempfile.mkdtemp()
    result = loop.train(_Small, logdir, max_steps=1)
    self.assertEqual(result.global_step, 1)
    self.assertGreater(result.train_metrics['loss'], 0.0)
    bleu = reversal.EvaluateBleu(_Small, logdir, max_batches=1)
    self.assertLen(bleu.hypotheses, _Small.BATCH_SIZE)
    self.assertBetween(bleu.bleu, 0.0, 100.0)
    # Untrained: nowhere near the references.
    self.assertLess(bleu.exact_match, 0.5)
    with self.assertRaises(checkpoints.NoCheckpointError):
      reversal.EvaluateBleu(_Small, tempfile.mkdtemp())


if __name__ == '__main__':
  tf.test.main()
