"""Real datasets the project writes itself, offline, as ordinary TFDS datasets.

``PrepareDigits(data_dir)`` stores scikit-learn's bundled copy of the UCI
optical handwritten digits (1,797 real 8x8 greyscale images of 0-9, no
network) as the TFDS dataset ``digits``. Afterwards
``tfds.builder('digits', data_dir=data_dir)`` finds it like any prepared
dataset, so ``inputs.TFDSImageInput`` with ``dataset_name='digits'`` reads it
through exactly the loading path a real download would take.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

DIGITS_NAME = 'digits'
DIGITS_VERSION = '1.0.0'
DIGITS_NUM_TEST = 360  # The last 360 examples in scikit-learn's order.
DIGITS_NUM_TRAIN = 1797 - DIGITS_NUM_TEST

__all__ = ['DIGITS_NAME', 'DIGITS_NUM_TEST', 'DIGITS_NUM_TRAIN',
           'DIGITS_VERSION', 'PrepareDigits']


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
  os.makedirs(os.path.join(data_dir, DIGITS_NAME), exist_ok=True)
  scratch = tempfile.mkdtemp(prefix=f'.{DIGITS_NAME}-', dir=data_dir)
  try:
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
            'gpipe_tf.datasets.PrepareDigits.'),
        disable_shuffling=True,
    )
    try:
      os.rename(os.path.join(scratch, DIGITS_NAME, DIGITS_VERSION), target)
    except OSError:
      if not _IsPrepared(target):  # Not lost to a concurrent writer: real.
        raise
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  return target


def _IsPrepared(version_dir: str) -> bool:
  return os.path.isfile(os.path.join(version_dir, 'dataset_info.json'))
