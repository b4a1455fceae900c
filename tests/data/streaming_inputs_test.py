"""Tests of gpipe_tf.data.streaming_inputs: block layout, order, exact resume, preprocessing, errors."""

import os
import shutil
import tempfile


import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

from gpipe_tf.data import datasets  # pylint: disable=g-import-not-at-top
import test_utils  # pylint: disable=g-import-not-at-top,g-bad-import-order
from gpipe_tf.data import inputs  # pylint: disable=g-import-not-at-top
from gpipe_tf.data import streaming_inputs  # pylint: disable=g-import-not-at-top

NAME = 'varsize'
NUM_TRAIN = 37
NUM_CLASSES = 3


class PlanBlocksTest(tf.test.TestCase):
  """Pure Python: file reads cut into blocks."""

  def testBlocksSpanFilesAndFilesSpanBlocks(self):
    layout = streaming_inputs.PlanBlocks(
        [('a', 2, 5), ('b', 0, 3), ('c', 1, 4)], block_size=4)
    self.assertEqual(layout.files, ('a', 'b', 'c'))
    self.assertEqual(layout.block_sizes, (4, 4, 4))
    self.assertEqual(layout.num_examples, 12)
    # Block 0: a[2:6]; block 1: a[6:7] + b[0:3]; block 2: c[1:5].
    rows = list(zip(layout.row_file, layout.row_skip, layout.row_take))
    self.assertEqual(rows, [(0, 2, 4), (0, 6, 1), (1, 0, 3), (2, 1, 4)])
    self.assertEqual(layout.block_row_start, (0, 1, 3, 4))

  def testLastBlockIsShorter(self):
    layout = streaming_inputs.PlanBlocks([('a', 0, 10)], block_size=4)
    self.assertEqual(layout.block_sizes, (4, 4, 2))
    self.assertEqual(layout.num_blocks, 3)
    with self.assertRaises(ValueError):
      streaming_inputs.PlanBlocks([('a', 0, 10)], block_size=0)


class TFDSStreamingImageInputTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    folder = os.path.join(cls.root, 'folder')
    test_utils.WriteVariableSizeImages(folder, NUM_TRAIN, NUM_CLASSES)
    cls.data_dir = os.path.join(cls.root, 'tfds')
    datasets.PrepareImageFolder(folder, NAME, cls.data_dir, num_shards=3)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def _Params(self, **kwargs):
    p = streaming_inputs.TFDSStreamingImageInput.Params().Set(
        dataset_name=NAME, data_dir=self.data_dir, image_size=12,
        batch_size=5, shuffle_block_size=4, shuffle_window_blocks=3,
        num_classes=NUM_CLASSES)
    return p.Set(**kwargs)

  def assertBatchesEqual(self, a, b):
    self.assertLen(a, len(b))
    for x, y in zip(a, b):
      self.assertAllEqual(x['inputs'], y['inputs'])
      self.assertAllEqual(x['labels'], y['labels'])

  def testSinglePassInFileOrderEqualsTFDS(self):
    # Evaluation settings: file order, whole images, every example once.
    p = self._Params(shuffle=False, repeat=False, drop_remainder=False,
                     eval_crop_fraction=1.0)
    gen = p.Instantiate()
    self.assertEqual(gen.NumExamples(), NUM_TRAIN)
    batches = list(gen.GetDataset().as_numpy_iterator())
    self.assertEqual([len(b['labels']) for b in batches], [5] * 7 + [2])
    images = np.concatenate([b['inputs'] for b in batches])
    labels = np.concatenate([b['labels'] for b in batches])
    self.assertEqual(images.shape, (NUM_TRAIN, 12, 12, 3))
    self.assertEqual(images.dtype, np.float32)
    self.assertEqual(labels.dtype, np.int32)
    builder = tfds.builder(NAME, data_dir=self.data_dir)
    reference = builder.as_dataset(
        split='train', shuffle_files=False,
        read_config=tfds.ReadConfig(interleave_cycle_length=1))
    expected = [(tf.image.resize(tf.image.grayscale_to_rgb(e['image'])
                                 if e['image'].shape[-1] == 1 else e['image'],
                                 [12, 12]) / 255.0, e['label'])
                for e in reference]
    self.assertAllEqual(labels, [int(l) for _, l in expected])
    # JPEG: decode_and_crop_jpeg of the whole image vs TFDS's decode.
    self.assertAllClose(images, np.stack([i for i, _ in expected]),
                        atol=1e-5)
    self.assertAllInRange(images, 0.0, 1.0)

  def testEveryEpochIsAFreshPermutation(self):
    # No augmentation and B = N: batch e is epoch e, images identify examples.
    p = self._Params(batch_size=NUM_TRAIN, eval_crop_fraction=1.0)
    epochs = test_utils.Batches(p.Instantiate(), 3)
    plain = test_utils.Batches(p.Copy().Set(shuffle=False).Instantiate(), 1)[0]

    def _Keys(batch):
      return [hash(x.tobytes()) for x in batch['inputs']]

    self.assertLen(set(_Keys(plain)), NUM_TRAIN)
    for epoch in epochs:
      self.assertCountEqual(_Keys(epoch), _Keys(plain))
    orders = [_Keys(b) for b in epochs + [plain]]
    self.assertLen({tuple(o) for o in orders}, 4)

  def testSkipBatchesEqualsUninterruptedStream(self):
    # N=37, B=5, windows of 12 examples: skips land mid-window, on a window
    # boundary and across epochs (batch 7 holds positions 35..39).
    p = self._Params(augment=True, cutout_size=3, seed=5)
    full = test_utils.Batches(p.Instantiate(), 19)
    for skip in (1, 7, 8, 12, 15):
      with self.subTest(skip=skip):
        resumed = test_utils.Batches(p.Instantiate(), 4, skip=skip)
        self.assertBatchesEqual(resumed, full[skip:skip + 4])

  def testSinglePassResume(self):
    p = self._Params(repeat=False, drop_remainder=False)
    full = list(p.Instantiate().GetDataset().as_numpy_iterator())
    self.assertLen(full, 8)
    self.assertBatchesEqual(
        list(p.Instantiate().GetDataset(5).as_numpy_iterator()), full[5:])
    self.assertEmpty(list(p.Instantiate().GetDataset(8).as_numpy_iterator()))

  def testDeterministicGivenSeedOnly(self):
    p = self._Params(augment=True, seed=3)
    tf.random.set_seed(1)
    first = test_utils.Batches(p.Instantiate(), 3)
    tf.random.set_seed(2)
    self.assertBatchesEqual(first, test_utils.Batches(p.Instantiate(), 3))
    other = test_utils.Batches(p.Copy().Set(seed=4).Instantiate(), 1)[0]
    self.assertNotAllClose(other['inputs'], first[0]['inputs'])

  def testSkipFarAheadIsCheap(self):
    p = self._Params()
    skip = 10**7  # ~1.4e6 epochs in: must not read them.
    result = {}

    def _Read():
      result['pair'] = test_utils.Batches(p.Instantiate(), 2, skip=skip - 1)
      result['one'] = test_utils.Batches(p.Instantiate(), 1, skip=skip)

    self.assertIsNone(test_utils.RaisesWithin(30, _Read))
    self.assertBatchesEqual(result['one'], result['pair'][1:])

  def testAugmentationCropsFlipsAndCutsOut(self):
    base = self._Params(shuffle=False, mean=[-1.0] * 3)  # Pixels in [1, 2].
    plain = test_utils.Batches(base.Instantiate(), 2)
    augmented = test_utils.Batches(base.Copy().Set(augment=True).Instantiate(), 2)
    cut = test_utils.Batches(base.Copy().Set(augment=True, cutout_size=4).Instantiate(),
                   2)
    for x, y, z in zip(plain, augmented, cut):
      self.assertAllEqual(x['labels'], y['labels'])
      self.assertNotAllClose(x['inputs'], y['inputs'])
      self.assertEqual(np.sum(y['inputs'] == 0.0), 0)
      zeros = np.sum(z['inputs'] == 0.0, axis=(1, 2, 3))
      self.assertAllInRange(zeros, 2 * 2 * 3, 4 * 4 * 3)  # Clipped at borders.

  def testGreyOutputAndNormalisation(self):
    p = self._Params(num_channels=1, mean=[0.5], std=[0.25])
    batch = test_utils.Batches(p.Instantiate(), 1)[0]
    self.assertEqual(batch['inputs'].shape, (5, 12, 12, 1))
    self.assertAllInRange(batch['inputs'], -2.0, 2.0)

  def testMissingDatasetRaisesNamedErrorFast(self):
    empty = os.path.join(self.get_temp_dir(), 'empty')
    p = self._Params(dataset_name='imagenet2012', data_dir=empty)
    error = test_utils.RaisesWithin(60, p.Instantiate().GetDataset)
    self.assertIsInstance(error, inputs.DatasetNotFoundError)
    self.assertIn(empty, str(error))
    self.assertIn('download=True', str(error))
    error = test_utils.RaisesWithin(
        60, self._Params(dataset_name='fgvc_aircraft',
                         data_dir=empty).Instantiate().NumExamples)
    self.assertIsInstance(error, inputs.DatasetNotFoundError)
    self.assertIn('PrepareImageFolder', str(error))

  def testConfigErrors(self):
    for bad in (dict(dataset_name=None), dict(num_channels=2),
                dict(image_size=0), dict(crop_area_range=(0.5, 1.5)),
                dict(crop_aspect_ratio_range=(2.0, 1.0)),
                dict(eval_crop_fraction=0.0), dict(mean=[0.5]),
                dict(shuffle_block_size=0)):
      with self.subTest(**bad):
        with self.assertRaises(inputs.InputConfigError):
          self._Params(**bad).Instantiate()
    for bad in (dict(image_key='pixels'), dict(num_classes=5),
                dict(split='validation')):
      with self.subTest(**bad):
        with self.assertRaises(inputs.InputConfigError):
          self._Params(**bad).Instantiate().NumExamples()


if __name__ == '__main__':
  tf.test.main()
