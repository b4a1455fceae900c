"""Tests of gpipe_tf.datasets: the digits dataset, written and read back via TFDS."""

import os
import sys
from unittest import mock

# Lets `python tests/datasets_test.py` import gpipe_tf from the repo root.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:
  sys.path.insert(0, _REPO_ROOT)

import numpy as np  # pylint: disable=g-import-not-at-top
from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

from gpipe_tf import datasets  # pylint: disable=g-import-not-at-top
from gpipe_tf import inputs  # pylint: disable=g-import-not-at-top


def _ReadSplit(data_dir, split):
  """(images [N, 8, 8, 1] on the 0..255 scale, labels [N]) in stored order."""
  p = inputs.TFDSImageInput.Params().Set(
      dataset_name='digits', data_dir=data_dir, split=split, batch_size=500,
      shuffle=False, repeat=False, drop_remainder=False, num_classes=10)
  batches = list(p.Instantiate().GetDataset().as_numpy_iterator())
  images = np.concatenate([b['inputs'] for b in batches]) * 255.0
  return images, np.concatenate([b['labels'] for b in batches])


class PrepareDigitsTest(tf.test.TestCase):

  def testRoundTripThroughTFDSImageInput(self):
    data_dir = self.get_temp_dir()
    path = datasets.PrepareDigits(data_dir)
    self.assertEqual(path, os.path.join(data_dir, 'digits', '1.0.0'))
    train_images, train_labels = _ReadSplit(data_dir, 'train')
    test_images, test_labels = _ReadSplit(data_dir, 'test')
    self.assertEqual(train_images.shape, (1437, 8, 8, 1))
    self.assertEqual(test_images.shape, (360, 8, 8, 1))
    self.assertEqual(len(train_labels) + len(test_labels), 1797)
    # Exactly scikit-learn's digits, in order: train first, test last.
    digits = sk_datasets.load_digits()
    expected = np.round(digits.images * 255.0 / 16.0)[..., np.newaxis]
    images = np.concatenate([train_images, test_images])
    self.assertAllClose(images, expected, atol=1e-3)
    self.assertAllEqual(np.concatenate([train_labels, test_labels]),
                        digits.target)
    self.assertEqual(images.min(), 0.0)
    self.assertAllClose(images.max(), 255.0, atol=1e-3)
    for labels in (train_labels, test_labels):
      self.assertAllEqual(np.unique(labels), np.arange(10))

  def testStoredAsAnOrdinaryTFDSDataset(self):
    data_dir = self.get_temp_dir()
    datasets.PrepareDigits(data_dir)
    builder = tfds.builder('digits', data_dir=data_dir)
    self.assertTrue(builder.is_prepared())
    self.assertEqual(builder.info.splits['train'].num_examples, 1437)
    self.assertEqual(builder.info.splits['test'].num_examples, 360)
    self.assertEqual(builder.info.features['label'].num_classes, 10)
    self.assertEqual(builder.info.features['image'].shape, (8, 8, 1))
    self.assertEqual(builder.info.features['image'].dtype, np.uint8)

  def testSecondCallDoesNothing(self):
    data_dir = self.get_temp_dir()
    path = datasets.PrepareDigits(data_dir)
    info = os.path.join(path, 'dataset_info.json')
    before = os.stat(info).st_mtime_ns
    with mock.patch.object(tfds.dataset_builders, 'store_as_tfds_dataset',
                           side_effect=AssertionError('wrote again')):
      self.assertEqual(datasets.PrepareDigits(data_dir), path)
    self.assertEqual(os.stat(info).st_mtime_ns, before)
    self.assertEqual(os.listdir(data_dir), ['digits'])  # No scratch left.

  def testLosingARaceKeepsTheWinnersCopy(self):
    data_dir = self.get_temp_dir()
    path = datasets.PrepareDigits(data_dir)
    info = os.path.join(path, 'dataset_info.json')
    before = os.stat(info).st_mtime_ns
    # A second writer that checked before the first finished: it writes its
    # own copy, cannot rename it over the winner's, and discards it.
    with mock.patch.object(datasets, '_IsPrepared', side_effect=[False, True]):
      self.assertEqual(datasets.PrepareDigits(data_dir), path)
    self.assertEqual(os.stat(info).st_mtime_ns, before)
    self.assertEqual(os.listdir(data_dir), ['digits'])
    self.assertEqual(os.listdir(os.path.dirname(path)), ['1.0.0'])
    self.assertLen(_ReadSplit(data_dir, 'test')[1], 360)


if __name__ == '__main__':
  tf.test.main()
