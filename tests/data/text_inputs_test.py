"""Tests of gpipe_tf.data.text_inputs: features, language tokens, buckets, resume, TFDS errors."""

import os
import shutil
import tempfile
import time

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf
import tensorflow_datasets as tfds

from gpipe_tf.data import text_inputs  # pylint: disable=g-import-not-at-top
from gpipe_tf.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

_KEYS = {'src_ids', 'src_paddings', 'tgt_ids', 'tgt_labels', 'tgt_paddings'}


def _Numpy(batches):
  return [{k: v.numpy() for k, v in b.items()} for b in batches]


class ParallelTextInputTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.folder = os.path.join(cls.root, 'corpus')
    text_inputs.WriteReversalCorpus(cls.folder, num_train=300, num_test=40,
                                    seed=3, languages=('rev', 'mir'))

  def _Params(self, **kwargs):
    p = text_inputs.ParallelTextInput.Params().Set(
        folder=self.folder, build_vocab=True, vocab_size=200, max_length=24,
        batch_size=8, seed=5)
    return p.Set(**kwargs)

  def _Bucketed(self, **kwargs):
    return self._Params(bucket_boundaries=[8, 12, 16],
                        bucket_batch_sizes=[10, 7, 5, 3], **kwargs)

  def testFeatures(self):
    gen = self._Params(shuffle=False, repeat=False, language_pairs=['en-rev'],
                       drop_remainder=False).Instantiate()
    vocab = gen.vocab
    batches = _Numpy(gen.GetDataset())
    self.assertLen(batches, 300 // 8 + 1)
    with open(os.path.join(self.folder, 'train.en-rev.en')) as f:
      sources = f.read().splitlines()
    rev_id = vocab.LanguageId('rev')
    for i, b in enumerate(batches[:3]):
      self.assertEqual(set(b), _KEYS)
      for key in _KEYS:
        self.assertEqual(b[key].shape, (8, 24))
        self.assertEqual(b[key].dtype,
                         np.float32 if key.endswith('paddings') else np.int32)
      for j in range(8):
        src, tgt_in, labels = b['src_ids'][j], b['tgt_ids'][j], b['tgt_labels'][j]
        n_src = int((1 - b['src_paddings'][j]).sum())
        n_tgt = int((1 - b['tgt_paddings'][j]).sum())
        # Paddings are a prefix of ones-free positions; padded ids are 0.
        np.testing.assert_array_equal(b['src_paddings'][j],
                                      np.arange(24) >= n_src)
        np.testing.assert_array_equal(b['tgt_paddings'][j],
                                      np.arange(24) >= n_tgt)
        self.assertTrue(np.all(src[n_src:] == 0) and np.all(labels[n_tgt:] == 0)
                        and np.all(tgt_in[n_tgt:] == 0))
        self.assertEqual(src[0], rev_id)
        self.assertEqual(src[n_src - 1], vocab.eos_id)
        self.assertEqual(tgt_in[0], vocab.bos_id)
        self.assertEqual(labels[n_tgt - 1], vocab.eos_id)
        np.testing.assert_array_equal(tgt_in[1:n_tgt], labels[:n_tgt - 1])
        source = sources[i * 8 + j]
        self.assertEqual(vocab.Decode(src), source)
        self.assertEqual(vocab.Decode(labels),
                         text_inputs.ReversalTarget(source, 'rev'))

  def testMultilingualTokensAndReverseDirection(self):
    gen = self._Params(shuffle=False, repeat=False).Instantiate()
    vocab = gen.vocab
    self.assertEqual(vocab.languages, ['en', 'mir', 'rev'])
    self.assertEqual(gen.NumExamples(), 600)  # Both pairs found in the folder.
    firsts = set()
    for b in gen.GetDataset():
      firsts |= set(b['src_ids'].numpy()[:, 0].tolist())
    self.assertEqual(firsts, {vocab.LanguageId('rev'), vocab.LanguageId('mir')})
    # 'rev-en' reads the en-rev files the other way round, '<2en>' first.
    back = self._Params(shuffle=False, language_pairs=['rev-en']).Instantiate()
    b = next(iter(back.GetDataset()))
    self.assertAllEqual(b['src_ids'][:, 0], [vocab.LanguageId('en')] * 8)
    source = vocab.Decode(b['src_ids'][0])
    self.assertEqual(vocab.Decode(b['tgt_labels'][0]),
                     text_inputs.ReversalTarget(source, 'rev'))
    no_token = self._Params(target_language_token=False,
                            language_pairs=['en-mir']).Instantiate()
    b = next(iter(no_token.GetDataset()))
    self.assertNotIn(vocab.LanguageId('mir'), b['src_ids'].numpy())

  def testBucketsGroupByLength(self):
    gen = self._Bucketed(repeat=False, drop_remainder=False).Instantiate()
    padded = {10: 7, 7: 11, 5: 15, 3: 24}
    bounds = {10: (0, 8), 7: (8, 12), 5: (12, 16), 3: (16, 25)}
    sizes_seen, total = set(), 0
    batches = _Numpy(gen.GetDataset())
    for b in batches:
      length = np.maximum((1 - b['src_paddings']).sum(1),
                          (1 - b['tgt_paddings']).sum(1))
      bucket = min(k for k, (lo, hi) in bounds.items()
                   if lo <= length.max() < hi)
      lo, hi = bounds[bucket]
      self.assertTrue(np.all((length >= lo) & (length < hi)), length)
      self.assertLessEqual(len(length), bucket)
      self.assertEqual(b['src_ids'].shape[1], padded[bucket])
      self.assertEqual(b['tgt_labels'].shape[1], padded[bucket])
      sizes_seen.add(bucket)
      total += len(length)
    self.assertGreaterEqual(len(sizes_seen), 2)
    self.assertEqual(total, gen.NumExamples())  # Every example, once.
    self.assertLen(batches, gen.BatchesPerEpoch())

  def testTokensPerBatch(self):
    gen = self._Params(bucket_boundaries=[8, 12],
                       tokens_per_batch=70).Instantiate()
    self.assertEqual(gen.bucket_batch_sizes, [10, 6, 2])

  def testDeterministicAndResumable(self):
    small = dict(language_pairs=['en-rev'], batch_size=32)
    sizes = dict(bucket_boundaries=[8, 12, 16],
                 bucket_batch_sizes=[30, 21, 15, 9])
    for p in (self._Params(**small), self._Params(**small, **sizes),
              self._Params(**small, **sizes, drop_remainder=False)):
      gen = p.Instantiate()
      per_epoch = gen.BatchesPerEpoch()
      full = _Numpy(gen.GetDataset().take(2 * per_epoch + 5))
      again = _Numpy(p.Instantiate().GetDataset().take(len(full)))
      for a, b in zip(full, again):
        for k in _KEYS:
          np.testing.assert_array_equal(a[k], b[k])
      for skip in (3, per_epoch, per_epoch + 2):
        resumed = _Numpy(gen.GetDataset(skip_batches=skip).take(4))
        for a, b in zip(full[skip:skip + 4], resumed):
          for k in _KEYS:
            np.testing.assert_array_equal(a[k], b[k])
      # Epochs differ in order; another seed gives another stream.
      self.assertNotAllEqual(full[0]['src_ids'][:, :5],
                             full[per_epoch]['src_ids'][:, :5])
      other = next(iter(p.Copy().Set(seed=6).Instantiate().GetDataset()))
      self.assertNotAllEqual(full[0]['src_ids'][:, :5],
                             other['src_ids'].numpy()[:, :5])

  def testOverlongPairs(self):
    dropped = self._Params(max_length=6, language_pairs=['en-rev'])
    kept = dropped.Copy().Set(truncate=True)
    self.assertLess(dropped.Instantiate().NumExamples(), 300)
    gen = kept.Instantiate()
    self.assertEqual(gen.NumExamples(), 300)
    b = next(iter(gen.GetDataset()))
    self.assertEqual(b['src_ids'].shape, (8, 6))
    lengths = (1 - b['src_paddings'].numpy()).sum(1).astype(int)
    self.assertTrue(np.all(b['src_ids'].numpy()[np.arange(8), lengths - 1]
                           == vocab_lib.EOS_ID))

  def testFolderErrors(self):
    with self.assertRaisesRegex(text_inputs.DatasetNotFoundError, 'en-fr'):
      self._Params(language_pairs=['en-fr']).Instantiate().NumExamples()
    with self.assertRaisesRegex(text_inputs.DatasetNotFoundError, 'dev'):
      self._Params(split='dev').Instantiate().NumExamples()
    with self.assertRaisesRegex(vocab_lib.VocabularyError, 'build_vocab'):
      self._Params(vocab_path=os.path.join(self.root, 'none.model'),
                   build_vocab=False).Instantiate().NumExamples()
    with self.assertRaisesRegex(text_inputs.InputConfigError,
                                'bucket_boundaries'):
      self._Params(bucket_boundaries=[8, 8]).Instantiate()
    with self.assertRaisesRegex(text_inputs.InputConfigError,
                                'bucket_batch_sizes'):
      self._Params(bucket_boundaries=[8], bucket_batch_sizes=[4]).Instantiate()
    with self.assertRaisesRegex(text_inputs.InputConfigError, 'exactly one'):
      self._Params(tfds_name='x').Instantiate()
    with self.assertRaisesRegex(text_inputs.InputConfigError, "'en-de'"):
      self._Params(language_pairs=['ende']).Instantiate()

  def testMissingTfdsDatasetRaisesQuickly(self):
    empty = tempfile.mkdtemp()
    p = text_inputs.ParallelTextInput.Params().Set(
        tfds_name='wmt14_translate/de-en', data_dir=empty,
        vocab_path=os.path.join(empty, 'vocab.model'), build_vocab=True)
    start = time.time()
    with self.assertRaisesRegex(text_inputs.DatasetNotFoundError,
                                'not prepared'):
      p.Instantiate().NumExamples()
    with self.assertRaisesRegex(text_inputs.DatasetNotFoundError,
                                'neither a TFDS dataset'):
      p.Copy().Set(tfds_name='no_such_dataset_xyz').Instantiate().NumExamples()
    self.assertLess(time.time() - start, 20.0)

  def testTfdsDataset(self):
    data_dir = tempfile.mkdtemp()
    sentences = ['apple river stone', 'cloud tiger', 'maple candle silver']
    examples = [(i, {'en': s, 'de': text_inputs.ReversalTarget(s, 'rev')})
                for i, s in enumerate(sentences * 4)]
    tfds.dataset_builders.store_as_tfds_dataset(
        name='tiny_translate', version='1.0.0',
        features=tfds.features.FeaturesDict({
            'en': tfds.features.Text(), 'de': tfds.features.Text()}),
        split_datasets={'train': examples}, data_dir=data_dir,
        disable_shuffling=True)
    p = text_inputs.ParallelTextInput.Params().Set(
        tfds_name='tiny_translate', data_dir=data_dir,
        language_pairs=['en-de'], vocab_path=os.path.join(data_dir, 'v.model'),
        build_vocab=True, vocab_size=60, batch_size=4, shuffle=False)
    gen = p.Instantiate()
    self.assertEqual(gen.NumExamples(), 12)
    self.assertEqual(gen.vocab.languages, ['de', 'en'])
    b = next(iter(gen.GetDataset()))
    self.assertEqual(gen.vocab.Decode(b['src_ids'][1]), 'cloud tiger')
    self.assertEqual(gen.vocab.Decode(b['tgt_labels'][1]), 'tiger cloud')
    self.assertAllEqual(b['src_ids'][:, 0], [gen.vocab.LanguageId('de')] * 4)
    shutil.rmtree(data_dir)


class ReversalCorpusTest(tf.test.TestCase):

  def testIdempotentAndDisjoint(self):
    folder = os.path.join(tempfile.mkdtemp(), 'c')
    paths = text_inputs.WriteReversalCorpus(folder, 200, 50, seed=1)
    stamps = {p: os.stat(p).st_mtime_ns for p in paths}
    self.assertEqual(text_inputs.WriteReversalCorpus(folder, 200, 50, seed=1),
                     paths)
    self.assertEqual({p: os.stat(p).st_mtime_ns for p in paths}, stamps)
    with open(os.path.join(folder, 'train.en-rev.en')) as f:
      train = f.read().splitlines()
    with open(os.path.join(folder, 'test.en-rev.en')) as f:
      test = f.read().splitlines()
    with open(os.path.join(folder, 'test.en-rev.rev')) as f:
      test_targets = f.read().splitlines()
    self.assertLen(train, 200)
    self.assertLen(test, 50)
    self.assertFalse(set(train) & set(test))
    self.assertEqual(test_targets,
                     [text_inputs.ReversalTarget(s, 'rev') for s in test])
    with self.assertRaises(text_inputs.CorpusExistsError):
      text_inputs.WriteReversalCorpus(folder, 200, 50, seed=2)

  def testTargets(self):
    self.assertEqual(text_inputs.ReversalTarget('apple river', 'rev'),
                     'river apple')
    self.assertEqual(text_inputs.ReversalTarget('apple river', 'mir'),
                     'revir elppa')
    with self.assertRaisesRegex(text_inputs.InputConfigError, "'xx'"):
      text_inputs.ReversalTarget('apple', 'xx')


if __name__ == '__main__':
  tf.test.main()
