"""Tests of gpipe_tf.data.inputs: batch layout, seeding, exact resume, TFDS loading."""

import os


import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

from gpipe_tf.data import datasets  # pylint: disable=g-import-not-at-top
import test_utils  # pylint: disable=g-import-not-at-top,g-bad-import-order
from gpipe_tf.data import inputs  # pylint: disable=g-import-not-at-top


def _Synthetic(**kwargs):
  return inputs.SyntheticClassificationInput.Params().Set(**kwargs)


class SyntheticClassificationInputTest(tf.test.TestCase):

  def assertBatchesEqual(self, a, b):
    self.assertLen(a, len(b))
    for x, y in zip(a, b):
      self.assertAllEqual(x['inputs'], y['inputs'])
      self.assertAllEqual(x['labels'], y['labels'])

  def testShapesAndDtypes(self):
    gen = _Synthetic(batch_size=8, input_dim=5, num_classes=3).Instantiate()
    ds = gen.GetDataset()
    self.assertEqual(ds.element_spec['inputs'].shape.as_list(), [8, 5])
    self.assertEqual(ds.element_spec['inputs'].dtype, tf.float32)
    self.assertEqual(ds.element_spec['labels'].shape.as_list(), [8])
    self.assertEqual(ds.element_spec['labels'].dtype, tf.int32)
    batch = test_utils.Batches(gen, 1)[0]
    self.assertEqual(batch['inputs'].shape, (8, 5))
    self.assertEqual(gen.NumExamples(), 1024)

  def testParamsAreCopiedAndFrozen(self):
    p = _Synthetic(batch_size=4)
    gen = p.Instantiate()
    p.batch_size = 16
    self.assertEqual(gen.p.batch_size, 4)
    self.assertTrue(gen.p.IsFrozen())

  def testDeterministicGivenSeed(self):
    p = _Synthetic(batch_size=32, num_examples=100, seed=3)
    first = test_utils.Batches(p.Instantiate(), 8)
    self.assertBatchesEqual(first, test_utils.Batches(p.Instantiate(), 8))
    other = test_utils.Batches(p.Copy().Set(seed=4).Instantiate(), 8)
    self.assertNotAllEqual(first[0]['inputs'], other[0]['inputs'])

  def testIndependentOfGlobalSeed(self):
    p = _Synthetic(batch_size=32, num_examples=100)
    tf.random.set_seed(1)
    first = test_utils.Batches(p.Instantiate(), 5)
    tf.random.set_seed(2)
    self.assertBatchesEqual(first, test_utils.Batches(p.Instantiate(), 5))

  def testEachEpochIsANewPermutation(self):
    gen = _Synthetic(batch_size=10, num_examples=50).Instantiate()
    batches = test_utils.Batches(gen, 10)
    epoch0 = np.concatenate([b['inputs'] for b in batches[:5]])
    epoch1 = np.concatenate([b['inputs'] for b in batches[5:]])
    data = gen._LoadExamples()['inputs']  # pylint: disable=protected-access
    for epoch in (epoch0, epoch1):  # Every example exactly once.
      self.assertAllEqual(np.sort(epoch, axis=0), np.sort(data, axis=0))
    self.assertNotAllEqual(epoch0, epoch1)
    self.assertNotAllEqual(epoch0, data)

  def testNoShuffleKeepsDataOrder(self):
    gen = _Synthetic(batch_size=10, num_examples=30, shuffle=False).Instantiate()
    data = gen._LoadExamples()['inputs']  # pylint: disable=protected-access
    stream = np.concatenate([b['inputs'] for b in test_utils.Batches(gen, 6)])
    self.assertAllEqual(stream, np.concatenate([data, data]))

  def testSkipBatchesEqualsUninterruptedStream(self):
    # N=70, B=16: epochs end inside batches 4, 8, 13; skips land before,
    # on and after those boundaries.
    for shuffle, skips in ((True, (1, 4, 5, 13)), (False, (4, 9))):
      p = _Synthetic(batch_size=16, num_examples=70, shuffle=shuffle, seed=7)
      full = test_utils.Batches(p.Instantiate(), 16)
      for skip in skips:
        with self.subTest(shuffle=shuffle, skip=skip):
          resumed = test_utils.Batches(p.Instantiate(), 16 - skip, skip=skip)
          self.assertBatchesEqual(resumed, full[skip:])

  def testSkipFarAheadIsCheapAndExact(self):
    n, batch_size, skip = 70, 16, 10**8  # ~2e7 epochs in: must not read them.
    gen = _Synthetic(batch_size=batch_size, num_examples=n).Instantiate()
    result = {}

    def _First():
      result['batch'] = test_utils.Batches(gen, 1, skip=skip)[0]

    self.assertIsNone(test_utils.RaisesWithin(20, _First))
    data = gen._LoadExamples()['inputs']  # pylint: disable=protected-access
    expected = []
    for position in range(skip * batch_size, (skip + 1) * batch_size):
      epoch, offset = divmod(position, n)
      order = gen._EpochOrder(tf.constant(epoch, tf.int64)).numpy()  # pylint: disable=protected-access
      expected.append(data[order[offset]])
    self.assertAllEqual(result['batch']['inputs'], np.stack(expected))

  def testSinglePass(self):
    p = _Synthetic(batch_size=10, num_examples=25, repeat=False,
                   drop_remainder=False, shuffle=True)
    full = list(p.Instantiate().GetDataset().as_numpy_iterator())
    self.assertEqual([len(b['labels']) for b in full], [10, 10, 5])
    resumed = list(p.Instantiate().GetDataset(2).as_numpy_iterator())
    self.assertBatchesEqual(resumed, full[2:])
    self.assertEmpty(list(p.Instantiate().GetDataset(3).as_numpy_iterator()))
    dropped = p.Copy().Set(drop_remainder=True).Instantiate().GetDataset()
    self.assertLen(list(dropped.as_numpy_iterator()), 2)

  def testTeacherLabelsAreBalancedAndLinearlyLearnable(self):
    num_classes = 5
    p = _Synthetic(num_examples=4000, input_dim=12, num_classes=num_classes)
    train = p.Instantiate()._LoadExamples()  # pylint: disable=protected-access
    counts = np.bincount(train['labels'], minlength=num_classes)
    self.assertLen(counts, num_classes)
    self.assertAllGreater(counts, 0.5 * 4000 / num_classes)
    self.assertAllLess(counts, 2.0 * 4000 / num_classes)
    # Least squares on one-hot targets, scored on a held-out draw (same
    # teacher, other data_seed): a linear model must do far above chance.
    weights, *_ = np.linalg.lstsq(train['inputs'],
                                  np.eye(num_classes)[train['labels']],
                                  rcond=None)
    held_out = p.Copy().Set(data_seed=1).Instantiate()._LoadExamples()  # pylint: disable=protected-access
    self.assertNotAllEqual(held_out['inputs'][:10], train['inputs'][:10])
    accuracy = np.mean(
        np.argmax(held_out['inputs'] @ weights, axis=1) == held_out['labels'])
    self.assertGreater(accuracy, 0.8)

  def testNoiseFlipsSomeLabels(self):
    clean = _Synthetic().Instantiate()._LoadExamples()  # pylint: disable=protected-access
    noisy = _Synthetic(noise=1.0).Instantiate()._LoadExamples()  # pylint: disable=protected-access
    self.assertAllEqual(clean['inputs'], noisy['inputs'])
    changed = np.mean(clean['labels'] != noisy['labels'])
    self.assertGreater(changed, 0.05)
    self.assertLess(changed, 0.8)

  def testBadParamsRaise(self):
    with self.assertRaises(inputs.InputConfigError):
      _Synthetic(batch_size=0).Instantiate()
    with self.assertRaises(inputs.InputConfigError):
      _Synthetic(num_classes=1).Instantiate()
    with self.assertRaises(ValueError):
      _Synthetic().Instantiate().GetDataset(skip_batches=-1)


def _Image(**kwargs):
  return inputs.TFDSImageInput.Params().Set(**kwargs)


class TFDSImageInputTest(tf.test.TestCase):

  def testMockCifar10ShapesAndRange(self):
    with tfds.testing.mock_data(num_examples=40):
      gen = _Image(dataset_name='cifar10', split='train', batch_size=8,
                   num_classes=10, data_dir=self.get_temp_dir()).Instantiate()
      self.assertEqual(gen.NumExamples(), 40)
      batches = test_utils.Batches(gen, 6)  # 48 > 40: crosses an epoch.
    for batch in batches:
      self.assertEqual(batch['inputs'].shape, (8, 32, 32, 3))
      self.assertEqual(batch['inputs'].dtype, np.float32)
      self.assertEqual(batch['labels'].dtype, np.int32)
      self.assertAllInRange(batch['labels'], 0, 9)
      self.assertAllInRange(batch['inputs'], 0.0, 1.0)
    self.assertGreater(np.std(batches[0]['inputs']), 0.1)

  def testAugmentResizeAndChannels(self):
    with tfds.testing.mock_data(num_examples=20):
      p = _Image(dataset_name='cifar10', batch_size=4, image_size=24,
                 num_channels=1, augment=True, mean=[0.5], std=[0.25])
      batch = test_utils.Batches(p.Instantiate(), 1)[0]
      plain = test_utils.Batches(p.Copy().Set(augment=False).Instantiate(), 1)[0]
    self.assertEqual(batch['inputs'].shape, (4, 24, 24, 1))
    self.assertEqual(plain['inputs'].shape, (4, 24, 24, 1))
    self.assertAllEqual(batch['labels'], plain['labels'])  # Same order.
    self.assertNotAllClose(batch['inputs'], plain['inputs'])
    self.assertAllInRange(plain['inputs'], -2.0, 2.0)  # (x - .5) / .25.

  def testCutoutZeroesOneSquare(self):
    with tfds.testing.mock_data(num_examples=16):
      # mean -1 lifts every pixel to [1, 2]; only cutout writes zeros.
      p = _Image(dataset_name='cifar10', batch_size=16, augment=True,
                 mean=[-1.0] * 3)
      with_cutout = test_utils.Batches(p.Copy().Set(cutout_size=8).Instantiate(), 1)[0]
      without = test_utils.Batches(p.Instantiate(), 1)[0]
    self.assertEqual(np.sum(without['inputs'] == 0.0), 0)
    zeros = np.sum(with_cutout['inputs'] == 0.0, axis=(1, 2, 3))
    self.assertAllInRange(zeros, 4 * 4 * 3, 8 * 8 * 3)  # Clipped at borders.

  def testAugmentationIsSeededAndResumable(self):
    data_dir = self.get_temp_dir()
    datasets.PrepareDigits(data_dir)
    # 1,437 train examples, B=256: batch 5 spans epochs 0 and 1.
    p = _Image(dataset_name='digits', data_dir=data_dir, batch_size=256,
               augment=True, image_size=10, cutout_size=3, seed=11)
    full = test_utils.Batches(p.Instantiate(), 8)
    for skip in (5, 6):
      resumed = test_utils.Batches(p.Instantiate(), 2, skip=skip)
      for x, y in zip(resumed, full[skip:skip + 2], strict=True):
        self.assertAllEqual(x['inputs'], y['inputs'])
        self.assertAllEqual(x['labels'], y['labels'])
    other = test_utils.Batches(p.Copy().Set(seed=12).Instantiate(), 1)[0]
    self.assertNotAllClose(other['inputs'], full[0]['inputs'])

  def testClassSubsetKeepsAndRelabelsClasses(self):
    data_dir = self.get_temp_dir()
    datasets.PrepareDigits(data_dir)
    p = _Image(dataset_name='digits', data_dir=data_dir, split='test',
               shuffle=False, repeat=False, drop_remainder=False,
               batch_size=500)
    everything = test_utils.Batches(p.Instantiate(), 1)[0]
    subset = test_utils.Batches(p.Copy().Set(class_subset=[7, 2], num_classes=2)
                      .Instantiate(), 1)[0]
    kept = np.isin(everything['labels'], [7, 2])
    self.assertAllEqual(subset['inputs'], everything['inputs'][kept])
    self.assertAllEqual(subset['labels'],
                        np.where(everything['labels'][kept] == 7, 0, 1))
    for bad in (dict(class_subset=[1, 1]), dict(class_subset=[]),
                dict(class_subset=[1, 2], num_classes=3)):
      with self.subTest(**bad):
        with self.assertRaises(inputs.InputConfigError):
          p.Copy().Set(**bad).Instantiate()
    with self.assertRaisesRegex(inputs.InputConfigError, 'beyond'):
      p.Copy().Set(class_subset=[3, 10]).Instantiate().NumExamples()

  def testCropResizeMatchesTensorFlowBilinear(self):
    images = tf.random.stateless_uniform([5, 13, 11, 3], seed=[1, 2])
    seed = tf.constant([3, 4], tf.int64)
    for size in ([7, 9], [1, 1], [20, 20]):
      out = inputs._RandomCropResize(images, size, 0.5, seed)  # pylint: disable=protected-access
      # The same boxes, drawn as _RandomCropResize draws them.
      side_seed, corner_seed = tf.unstack(
          tf.random.experimental.stateless_split(seed, 2))
      side = tf.random.stateless_uniform([5], side_seed, minval=0.5)
      corner = tf.random.stateless_uniform([5, 2], corner_seed)
      corner *= (1.0 - side)[:, None]
      boxes = tf.concat([corner, corner + side[:, None]], axis=1)
      expected = tf.image.crop_and_resize(images, boxes, tf.range(5), size)
      self.assertAllClose(out, expected, atol=1e-5)

  def testMissingRegisteredDatasetRaisesNamedErrorFast(self):
    data_dir = os.path.join(self.get_temp_dir(), 'empty')
    gen = _Image(dataset_name='cifar10', data_dir=data_dir).Instantiate()
    error = test_utils.RaisesWithin(60, gen.GetDataset)
    self.assertIsInstance(error, inputs.DatasetNotFoundError)
    self.assertIsInstance(error, FileNotFoundError)
    self.assertIn(data_dir, str(error))
    self.assertIn('download=True', str(error))

  def testMissingUnregisteredDatasetRaisesNamedError(self):
    data_dir = os.path.join(self.get_temp_dir(), 'empty')
    gen = _Image(dataset_name='digits', data_dir=data_dir).Instantiate()
    error = test_utils.RaisesWithin(60, gen.NumExamples)
    self.assertIsInstance(error, inputs.DatasetNotFoundError)
    self.assertIn('PrepareDigits', str(error))

  def testConfigErrors(self):
    with self.assertRaises(inputs.InputConfigError):
      _Image().Instantiate()  # No dataset_name.
    with self.assertRaises(inputs.InputConfigError):
      _Image(dataset_name='cifar10', num_channels=2).Instantiate()
    with tfds.testing.mock_data(num_examples=4):
      for bad in (dict(image_key='pixels'), dict(num_classes=100),
                  dict(mean=[0.5, 0.5])):
        with self.subTest(**bad):
          gen = _Image(dataset_name='cifar10', **bad).Instantiate()
          with self.assertRaises(inputs.InputConfigError):
            gen.NumExamples()


if __name__ == '__main__':
  tf.test.main()
