"""Tests of gpipe_tf.data.datasets: the digits and image-folder datasets, written and read back via TFDS."""

import os
import tempfile
from unittest import mock


import numpy as np  # pylint: disable=g-import-not-at-top
from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

from gpipe_tf.data import datasets  # pylint: disable=g-import-not-at-top
from gpipe_tf.data import inputs  # pylint: disable=g-import-not-at-top


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


class PrepareImageFolderTest(tf.test.TestCase):

  def _Folder(self, layout):
    """Writes {relative path: (height, width)} PNG/JPEG files; returns root."""
    root = os.path.join(tempfile.mkdtemp(dir=self.get_temp_dir()), 'images')
    rng = np.random.default_rng(0)
    for path, (height, width) in layout.items():
      os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
      image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
      encode = tf.io.encode_png if path.endswith('.png') else tf.io.encode_jpeg
      tf.io.write_file(os.path.join(root, path), encode(image))
    return root

  def testWritesSplitsClassesAndOriginalBytes(self):
    root = self._Folder({'train/b/1.png': (5, 7), 'train/a/2.JPG': (9, 4),
                         'train/b/3.jpeg': (6, 6), 'test/c/4.png': (3, 8),
                         'train/b/notes.txt': (1, 1)})
    data_dir = tempfile.mkdtemp(dir=self.get_temp_dir())
    path = datasets.PrepareImageFolder(root, 'toy_folder', data_dir)
    self.assertEqual(path, os.path.join(data_dir, 'toy_folder', '1.0.0'))
    builder = tfds.builder('toy_folder', data_dir=data_dir)
    self.assertEqual(builder.info.features['label'].names, ['a', 'b', 'c'])
    self.assertEqual(builder.info.splits['train'].num_examples, 3)
    self.assertEqual(builder.info.splits['test'].num_examples, 1)
    stored = builder.as_dataset(
        split='train', decoders={'image': tfds.decode.SkipDecoding()})
    found = {}
    for example in stored.as_numpy_iterator():
      found[example['image']] = example['label']
    for name, label in (('b/1.png', 1), ('a/2.JPG', 0), ('b/3.jpeg', 1)):
      with open(os.path.join(root, 'train', name), 'rb') as f:
        self.assertEqual(found[f.read()], label)  # Bytes kept as they were.
    # Idempotent: a second call leaves the dataset alone.
    mtime = os.stat(os.path.join(path, 'dataset_info.json')).st_mtime_ns
    datasets.PrepareImageFolder(root, 'toy_folder', data_dir)
    self.assertEqual(
        os.stat(os.path.join(path, 'dataset_info.json')).st_mtime_ns, mtime)

  def testBadLayoutsRaise(self):
    data_dir = tempfile.mkdtemp(dir=self.get_temp_dir())
    flat = self._Folder({'x.png': (2, 2)})
    with self.assertRaisesRegex(datasets.ImageFolderError, 'no split'):
      datasets.PrepareImageFolder(flat, 'flat', data_dir)
    no_class = self._Folder({'train/x.png': (2, 2)})
    with self.assertRaisesRegex(datasets.ImageFolderError, 'no class'):
      datasets.PrepareImageFolder(no_class, 'no_class', data_dir)
    empty = self._Folder({'train/a/x.txt': (2, 2)})
    with self.assertRaisesRegex(datasets.ImageFolderError, 'no image'):
      datasets.PrepareImageFolder(empty, 'empty', data_dir)


if __name__ == '__main__':
  tf.test.main()
