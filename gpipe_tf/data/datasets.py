"""Datasets written offline as TFDS datasets: the bundled digits, and image folders TFDS lacks.

``PrepareDigits(data_dir)`` stores scikit-learn's bundled copy of the UCI
optical handwritten digits (1,797 real 8x8 greyscale images of 0-9, no
network) as the TFDS dataset ``digits``. Afterwards
``tfds.builder('digits', data_dir=data_dir)`` finds it like any prepared
dataset, so ``inputs.TFDSImageInput`` with ``dataset_name='digits'`` reads it
through exactly the loading path a real download would take.

``PrepareImageFolder(root, name, data_dir)`` does the same for images the
user already has on disk as ``root/<split>/<class>/<image>``: the way to
bring data TFDS 4.9 has no builder for (FGVC Aircraft, Birdsnap) to
``streaming_inputs.TFDSStreamingImageInput``, which reads prepared TFRecord
files (``tfds.ImageFolder`` reads the folder directly, without them).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable

import numpy as np

from gpipe_tf import errors

DIGITS_NAME = 'digits'
DIGITS_VERSION = '1.0.0'
DIGITS_NUM_TEST = 360  # The last 360 examples in scikit-learn's order.
DIGITS_NUM_TRAIN = 1797 - DIGITS_NUM_TEST

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif')

__all__ = ['DIGITS_NAME', 'DIGITS_NUM_TEST', 'DIGITS_NUM_TRAIN',
           'DIGITS_VERSION', 'IMAGE_EXTENSIONS', 'ImageFolderError',
           'PrepareDigits', 'PrepareImageFolder']


class ImageFolderError(errors.Error, ValueError):
  """A folder of images that is not laid out as root/<split>/<class>/."""


def PrepareDigits(data_dir: str) -> str:
  """Writes the ``digits`` TFDS dataset into `data_dir` unless it is there.

  Contents: features ``image`` (uint8 [8, 8, 1], the original 0..16 ink
  levels scaled to 0..255 and rounded, so 16 -> 255) and ``label``
  (ClassLabel, names '0'..'9'). Split: in scikit-learn's order, the first
  1,437 examples are ``train`` and the last 360 ``test`` (no shuffling, at
  write time or here; the order inside each split is kept). Readers shuffle.

  Idempotent: if ``data_dir/digits/1.0.0`` exists it is left alone. Safe when
  several processes call it at once: each writes into its own temporary
  directory inside `data_dir` and renames the finished version folder into
  place; a process that loses the race discards its copy. `data_dir` must be
  a local path (the rename is os.rename).

  Args:
    data_dir: TFDS data directory (created if missing).

  Returns:
    The dataset's version folder, ``data_dir/digits/1.0.0``.
  """
  target = os.path.join(data_dir, DIGITS_NAME, DIGITS_VERSION)
  if _IsPrepared(target):
    return target
  # Imported here: preparing is rare, and sklearn is only needed for it.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top

  digits = sk_datasets.load_digits()
  images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
  images = images[..., np.newaxis]
  labels = digits.target.astype(np.int64)

  def _Split(indices):
    return [(int(i), {'image': images[i], 'label': labels[i]})
            for i in indices]

  num = len(labels)
  features = tfds.features.FeaturesDict({
      'image': tfds.features.Image(shape=(8, 8, 1)),
      'label': tfds.features.ClassLabel(names=[str(d) for d in range(10)]),
  })

  def _Store(scratch):
    tfds.dataset_builders.store_as_tfds_dataset(
        name=DIGITS_NAME,
        version=DIGITS_VERSION,
        features=features,
        split_datasets={
            'train': _Split(range(num - DIGITS_NUM_TEST)),
            'test': _Split(range(num - DIGITS_NUM_TEST, num)),
        },
        data_dir=scratch,
        description=(
            "scikit-learn's copy of the UCI optical recognition of "
            'handwritten digits data (8x8, 10 classes), written by '
            'gpipe_tf.data.datasets.PrepareDigits.'),
        disable_shuffling=True,
    )

  return _StoreAtomically(data_dir, DIGITS_NAME, DIGITS_VERSION, _Store)


def PrepareImageFolder(root: str, name: str, data_dir: str,
                       version: str = '1.0.0', num_channels: int = 3,
                       num_shards: int | None = None) -> str:
  """Writes the images under `root` as the TFDS dataset `name` in `data_dir`.

  Layout read: ``root/<split>/<class>/<image file>`` (extensions
  IMAGE_EXTENSIONS, any case), e.g. ``aircraft/train/A320/0034309.jpg``.
  Every sub-directory of `root` is a split; class ids are the class folder
  names of all splits, sorted (so splits agree). Features: ``image`` (the
  file's encoded bytes, kept as they are: JPEGs stay JPEGs; images may
  differ in size) and ``label`` (ClassLabel with those names). TFDS shuffles
  the examples when writing, as for its own datasets, so file order mixes
  the classes. Afterwards ``tfds.builder(name, data_dir=data_dir)`` and
  ``TFDSStreamingImageInput(dataset_name=name, data_dir=data_dir)`` read it.

  Idempotent and safe under concurrency like PrepareDigits: an existing
  ``data_dir/name/version`` is left alone.

  Args:
    root: the folder of splits.
    name: dataset name to register under (lower case, e.g. 'fgvc_aircraft').
    data_dir: TFDS data directory (created if missing).
    version: 'x.y.z'.
    num_channels: the images' channels as declared in the feature (readers
      decode to the channels they ask for).
    num_shards: files per split; None lets TFDS choose by size.

  Returns:
    The dataset's version folder, ``data_dir/name/version``.

  Raises:
    ImageFolderError: no split folder, a split with no class folder, or a
      class folder without images.
  """
  target = os.path.join(data_dir, name, version)
  if _IsPrepared(target):
    return target
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  if not os.path.isdir(root):
    raise ImageFolderError(f'{root} is not a directory of split folders.')
  splits = sorted(d for d in os.listdir(root)
                  if os.path.isdir(os.path.join(root, d)))
  if not splits:
    raise ImageFolderError(
        f'{root} holds no split folder; lay images out as '
        f'{root}/<split>/<class>/<image>.')
  files = {}  # split -> [(class name, path)]
  for split in splits:
    split_dir = os.path.join(root, split)
    classes = sorted(d for d in os.listdir(split_dir)
                     if os.path.isdir(os.path.join(split_dir, d)))
    if not classes:
      raise ImageFolderError(f'Split folder {split_dir} holds no class '
                             'folder.')
    files[split] = []
    for cls in classes:
      class_dir = os.path.join(split_dir, cls)
      images = sorted(f for f in os.listdir(class_dir)
                      if f.lower().endswith(IMAGE_EXTENSIONS))
      if not images:
        raise ImageFolderError(
            f'Class folder {class_dir} holds no image ({IMAGE_EXTENSIONS}).')
      files[split] += [(cls, os.path.join(class_dir, f)) for f in images]
  names = sorted({cls for pairs in files.values() for cls, _ in pairs})
  label = {cls: i for i, cls in enumerate(names)}
  features = tfds.features.FeaturesDict({
      'image': tfds.features.Image(shape=(None, None, num_channels)),
      'label': tfds.features.ClassLabel(names=names),
  })

  def _Examples(pairs):
    for cls, path in pairs:
      yield os.path.relpath(path, root), {'image': path, 'label': label[cls]}

  def _Store(scratch):
    tfds.dataset_builders.store_as_tfds_dataset(
        name=name, version=version, features=features,
        split_datasets={s: list(_Examples(p)) for s, p in files.items()},
        data_dir=scratch,
        download_config=tfds.download.DownloadConfig(num_shards=num_shards),
        description=(f'Images of {root}, written by '
                     'gpipe_tf.data.datasets.PrepareImageFolder.'))

  return _StoreAtomically(data_dir, name, version, _Store)


def _StoreAtomically(data_dir: str, name: str, version: str,
                     store: Callable[[str], object]) -> str:
  """Runs store(scratch dir) and renames scratch/name/version into place."""
  target = os.path.join(data_dir, name, version)
  os.makedirs(os.path.join(data_dir, name), exist_ok=True)
  scratch = tempfile.mkdtemp(prefix=f'.{name}-', dir=data_dir)
  try:
    store(scratch)
    try:
      os.rename(os.path.join(scratch, name, version), target)
    except OSError:
      if not _IsPrepared(target):  # Not lost to a concurrent writer: real.
        raise
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  return target


def _IsPrepared(version_dir: str) -> bool:
  return os.path.isfile(os.path.join(version_dir, 'dataset_info.json'))
