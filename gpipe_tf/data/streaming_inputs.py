"""Streaming image input: a TFDS split read from its files in a seeded, resumable order, any image size.

``TFDSStreamingImageInput`` is the reader for ImageNet and the fine-tuning
sets (Stanford Cars, Oxford Pets, Food-101, ...). It keeps the contract of
``gpipe_tf.data.inputs``: Params-declared, the stream a pure function of the
Params, ``GetDataset(skip_batches=k)`` equal to the uninterrupted stream with
its first k batches dropped. Unlike ``inputs.TFDSImageInput`` it never holds
the split in memory: it reads the prepared TFRecord shards of the split
directly (the FileInstructions TFDS computes for the split string) and
decodes one image at a time.

Order. The split's N examples, in file order, are cut into blocks of
``shuffle_block_size`` consecutive examples (C blocks, the last one
shorter). Epoch e visits the blocks in an order pi_e drawn statelessly from
(seed, e) and groups them, in that order, into windows of
``shuffle_window_blocks`` (W) blocks. A window's examples are read (W blocks
at once, deterministically interleaved) as encoded records and permuted by
a permutation drawn from (seed, e, window). The stream is the windows one
after the other, epochs without a gap::

  file order  |b0 |b1 |b2 |b3 |b4 |b5 |b6|        C = 7 blocks, W = 2
  epoch e     pi_e = 4 1 | 6 0 | 3 5 | 2           windows 0..3
  stream      perm(b4+b1) perm(b6+b0) perm(b3+b5) perm(b2) | epoch e+1 ...

TFDS shuffles examples when it writes a dataset, so file order is already
random; blocks plus windows give every epoch a fresh order whose shuffle
span is W blocks, like a shuffle buffer, while keeping positions computable.
With shuffle False the stream is file order.

Resume. Position P = k * B (B = batch_size) is in epoch P // N at offset
P % N; the window holding that offset follows from the block sizes (one
permutation of C block keys, no reading), and only that window is read and
permuted to drop its first examples. Resuming therefore costs reading at most
one window of encoded records (W * shuffle_block_size; ImageNet defaults:
4,096 JPEGs, ~0.45 GB), never the batches before it. Augmentation of the
example at stream position P is drawn from (seed, P), so a resumed stream
repeats the very crops, flips and cutouts.

Memory: about two windows of encoded records (the one being consumed and the
next, read ahead), plus the decoded batches in flight.

Per example: decode (JPEG: only the crop window, decode_and_crop_jpeg;
PNG and others: decode, then crop), crop, resize (bilinear) to image_size,
scale to [0, 1]; training (augment): an Inception-style random crop (area
fraction in crop_area_range, aspect ratio in crop_aspect_ratio_range, else
the whole image) and a random horizontal flip; evaluation: the central
eval_crop_fraction of height and width. Then (x - mean) / std, then with
augment and cutout_size > 0 a cutout square set to 0.

Deliberately NOT supported: ``tfds.testing.mock_data`` (it replaces
``as_dataset``, and this reader reads the files; tests write a small TFDS
dataset instead, e.g. with ``gpipe_tf.data.datasets.PrepareImageFolder``), and
file formats other than TFRecord (array_record, riegeli).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from gpipe_tf import hyperparams
from gpipe_tf.data import inputs

__all__ = ['PlanBlocks', 'SplitLayout', 'TFDSStreamingImageInput']

# Salts that keep the block order, window order and augmentation apart.
_BLOCK_SALT = 0x424C
_WINDOW_SALT = 0x574E
_AUGMENT_SALT = 0x4147


@dataclasses.dataclass(frozen=True)
class SplitLayout:
  """A split's records as contiguous blocks of (file, skip, take) reads.

  Block i reads rows block_row_start[i] .. block_row_start[i + 1] - 1; row r
  reads records row_skip[r] .. row_skip[r] + row_take[r] - 1 of file
  files[row_file[r]]. Pure data, built by PlanBlocks.
  """
  files: tuple[str, ...]
  row_file: tuple[int, ...]
  row_skip: tuple[int, ...]
  row_take: tuple[int, ...]
  block_row_start: tuple[int, ...]
  block_sizes: tuple[int, ...]

  @property
  def num_examples(self) -> int:
    return sum(self.block_sizes)

  @property
  def num_blocks(self) -> int:
    return len(self.block_sizes)


def PlanBlocks(reads: Sequence[tuple[str, int, int]],
               block_size: int) -> SplitLayout:
  """Cuts a split's file reads into blocks of `block_size` records.

  Args:
    reads: (filename, skip, take) per file, in split order (TFDS
      FileInstructions).
    block_size: records per block; the last block may be shorter. A block
      may span files; a file may span blocks.

  Returns:
    The SplitLayout (pure Python, no TensorFlow).
  """
  if not isinstance(block_size, int) or block_size < 1:
    raise ValueError(f'block_size must be a positive int, got {block_size!r}.')
  files, index = [], {}
  row_file, row_skip, row_take = [], [], []
  starts, sizes, filled = [0], [], 0
  for filename, skip, take in reads:
    if filename not in index:
      index[filename] = len(files)
      files.append(filename)
    while take > 0:
      n = min(take, block_size - filled)
      row_file.append(index[filename])
      row_skip.append(skip)
      row_take.append(n)
      skip, take, filled = skip + n, take - n, filled + n
      if filled == block_size:
        starts.append(len(row_file))
        sizes.append(filled)
        filled = 0
  if filled:
    starts.append(len(row_file))
    sizes.append(filled)
  return SplitLayout(tuple(files), tuple(row_file), tuple(row_skip),
                     tuple(row_take), tuple(starts), tuple(sizes))


class TFDSStreamingImageInput(inputs.BaseInputGenerator):
  """An image classification split streamed from its prepared TFDS files.

  See the module docstring for the order, the resume cost and the
  preprocessing. Loading: ``tfds.builder(dataset_name, data_dir=data_dir)``;
  if the split is not prepared, ``download_and_prepare()`` when download is
  True, else DatasetNotFoundError at once. Elements: {'inputs': float32
  [B, S, S, C], 'labels': int32 [B]} (S = image_size, C = num_channels).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    inputs.DefineTFDSImageParams(p, keep_stored=False)
    p.Define('crop_area_range', (0.08, 1.0),
             'With augment: range of the crop area as a fraction of the '
             'image.')
    p.Define('crop_aspect_ratio_range', (0.75, 4.0 / 3.0),
             'With augment: range of the crop width / height.')
    p.Define('eval_crop_fraction', 0.875,
             'Without augment: fraction of height and width kept by the '
             'central crop (1.0: the whole image).')
    p.Define('shuffle_block_size', 1024,
             'Consecutive examples (in file order) that move together when '
             'an epoch is shuffled.')
    p.Define('shuffle_window_blocks', 4,
             'Blocks read together and shuffled among each other: the '
             'shuffle span, the read-ahead unit and the resume cost.')
    p.Define('num_parallel_reads', 4,
             'Blocks of a window read in parallel (deterministically '
             'interleaved).')
    return p

  def __init__(self, params: hyperparams.InstantiableParams) -> None:
    super().__init__(params)
    p = self._params
    inputs.CheckTFDSImageParams(p, keep_stored=False)

    def _Check(ok: bool, what: str) -> None:
      if not ok:
        raise inputs.InputConfigError(f'{p.name}: {what}')

    for field in ('shuffle_block_size', 'shuffle_window_blocks',
                  'num_parallel_reads'):
      value = getattr(p, field)
      _Check(isinstance(value, int) and value >= 1,
             f'{field} must be an int >= 1, got {value!r}.')
    for field, top in (('crop_area_range', 1.0),
                       ('crop_aspect_ratio_range', None)):
      low, high = getattr(p, field)
      _Check(0 < low <= high and (top is None or high <= top),
             f'{field} must be (low, high) with 0 < low <= high'
             f'{" <= 1" if top else ""}, got {getattr(p, field)!r}.')
    _Check(0.0 < p.eval_crop_fraction <= 1.0,
           f'eval_crop_fraction must be in (0, 1], got '
           f'{p.eval_crop_fraction!r}.')
    self._layout: SplitLayout | None = None
    self._label_dtype = tf.int64

  # ---- Public ---------------------------------------------------------------
  def NumExamples(self) -> int:
    """N, examples in one epoch of the split (reads the dataset info only)."""
    return self._Layout().num_examples

  def GetDataset(self, skip_batches: int = 0) -> tf.data.Dataset:
    """The stream of batches from batch index `skip_batches` on.

    Args:
      skip_batches: index of the first batch; the result equals GetDataset()
        with its first `skip_batches` batches dropped, element for element.
        Cost: reading at most one window of encoded records (module doc).
        With repeat False, skipping past the end gives an empty dataset.

    Returns:
      A tf.data.Dataset of {'inputs', 'labels'} batches.
    """
    if not isinstance(skip_batches, int) or skip_batches < 0:
      raise ValueError(
          f'skip_batches must be a non-negative int, got {skip_batches!r}.')
    p = self._params
    layout = self._Layout()
    n = layout.num_examples
    per_window = p.shuffle_window_blocks
    num_windows = -(-layout.num_blocks // per_window)
    first_epoch, offset = divmod(skip_batches * p.batch_size, n)
    starts = self._WindowStarts(tf.constant(first_epoch, tf.int64)).numpy()
    first_window = int(np.searchsorted(starts, offset, side='right')) - 1
    within = offset - int(starts[first_window])
    first = first_epoch * num_windows + first_window
    if p.repeat:
      windows = tf.data.Dataset.counter(first)
    else:
      windows = tf.data.Dataset.range(first, num_windows)

    files = tf.constant(layout.files, tf.string)
    row_file = tf.constant(layout.row_file, tf.int64)
    row_skip = tf.constant(layout.row_skip, tf.int64)
    row_take = tf.constant(layout.row_take, tf.int64)
    block_row_start = tf.constant(layout.block_row_start, tf.int64)
    window_seed = tf.constant([p.seed, _WINDOW_SALT], tf.int64)
    # Unshuffled, blocks are read one after the other: file order.
    parallel = min(p.num_parallel_reads, per_window) if p.shuffle else 1

    @tf.autograph.experimental.do_not_convert
    def _BlockRecords(block):
      rows = tf.range(block_row_start[block], block_row_start[block + 1])
      reads = tf.data.Dataset.from_tensor_slices(
          (tf.gather(files, tf.gather(row_file, rows)),
           tf.gather(row_skip, rows), tf.gather(row_take, rows)))
      return reads.flat_map(
          lambda f, s, t: tf.data.TFRecordDataset(f).skip(s).take(t))

    @tf.autograph.experimental.do_not_convert
    def _ReadWindow(g):
      """Encoded records of global window g, permuted, and their positions."""
      epoch, w = g // num_windows, g % num_windows
      order = self._BlockOrder(epoch)
      blocks = order[w * per_window:(w + 1) * per_window]
      records = tf.data.Dataset.from_tensor_slices(blocks).interleave(
          _BlockRecords, cycle_length=parallel, block_length=1,
          num_parallel_calls=parallel, deterministic=True)
      records = records.batch(per_window * p.shuffle_block_size
                              ).get_single_element()
      count = tf.size(records, out_type=tf.int64)
      if p.shuffle:
        seed = tf.random.experimental.stateless_fold_in(
            tf.random.experimental.stateless_fold_in(window_seed, epoch), w)
        keys = tf.random.stateless_uniform([count], seed=seed, minval=None,
                                           maxval=None, dtype=tf.int64)
        records = tf.gather(records, tf.argsort(keys, stable=True))
      start = tf.where(g == first, tf.constant(within, tf.int64), 0)
      window_start = self._WindowStarts(epoch, order)[w]
      positions = epoch * n + window_start + tf.range(start, count)
      return records[start:], positions

    ds = windows.map(_ReadWindow, num_parallel_calls=2, deterministic=True)
    ds = ds.prefetch(1).unbatch()  # Reads the next window ahead.
    ds = ds.map(self._Example, num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    ds = ds.batch(p.batch_size, drop_remainder=p.drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE)

  # ---- Order ----------------------------------------------------------------
  def _BlockOrder(self, epoch: tf.Tensor) -> tf.Tensor:
    """Block indices of `epoch` in visiting order (int64 [C])."""
    num_blocks = self._Layout().num_blocks
    if not self._params.shuffle:
      return tf.range(num_blocks, dtype=tf.int64)
    seed = tf.random.experimental.stateless_fold_in(
        tf.constant([self._params.seed, _BLOCK_SALT], tf.int64), epoch)
    keys = tf.random.stateless_uniform([num_blocks], seed=seed, minval=None,
                                       maxval=None, dtype=tf.int64)
    return tf.cast(tf.argsort(keys, stable=True), tf.int64)

  def _WindowStarts(self, epoch: tf.Tensor,
                    order: tf.Tensor | None = None) -> tf.Tensor:
    """Offsets in `epoch` where each window starts, then N (int64 [C/W + 1])."""
    layout = self._Layout()
    if order is None:
      order = self._BlockOrder(epoch)
    per_window = self._params.shuffle_window_blocks
    num_windows = -(-layout.num_blocks // per_window)
    sizes = tf.gather(tf.constant(layout.block_sizes, tf.int64), order)
    sizes = tf.pad(sizes, [[0, num_windows * per_window - layout.num_blocks]])
    totals = tf.reduce_sum(tf.reshape(sizes, [num_windows, per_window]), 1)
    return tf.concat([[0], tf.cumsum(totals)], 0)

  # ---- Examples -------------------------------------------------------------
  def _Example(self, record: tf.Tensor, position: tf.Tensor
               ) -> dict[str, tf.Tensor]:
    """One encoded record at stream `position` to {'inputs', 'labels'}."""
    p = self._params
    parsed = tf.io.parse_single_example(record, {
        p.image_key: tf.io.FixedLenFeature([], tf.string),
        p.label_key: tf.io.FixedLenFeature([], self._label_dtype)})
    seed = tf.random.experimental.stateless_fold_in(
        tf.constant([p.seed, _AUGMENT_SALT], tf.int64), position)
    crop_seed, flip_seed, cutout_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 3))
    image = self._DecodeAndCrop(parsed[p.image_key], crop_seed)
    image = tf.image.resize(image, [p.image_size, p.image_size]) / 255.0
    if p.augment:
      image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    if p.mean is not None:
      image -= tf.constant(p.mean, tf.float32)
    if p.std is not None:
      image /= tf.constant(p.std, tf.float32)
    if p.augment and p.cutout_size:
      image = inputs.Cutout(image[tf.newaxis], p.cutout_size, cutout_seed)[0]
    return {'inputs': image, 'labels': tf.cast(parsed[p.label_key], tf.int32)}

  def _CropWindow(self, shape: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """[top, left, height, width] (int32) of the crop of an image [H, W]."""
    p = self._params
    if p.augment:
      begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
          tf.concat([shape, [p.num_channels]], 0),
          bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
          min_object_covered=p.crop_area_range[0],
          aspect_ratio_range=p.crop_aspect_ratio_range,
          area_range=p.crop_area_range, max_attempts=10,
          use_image_if_no_bounding_boxes=True)
      return tf.concat([begin[:2], size[:2]], 0)
    kept = tf.maximum(tf.cast(tf.round(tf.cast(shape, tf.float32) *
                                       p.eval_crop_fraction), tf.int32), 1)
    return tf.concat([(shape - kept) // 2, kept], 0)

  def _DecodeAndCrop(self, encoded: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """uint8 [h, w, C]: the crop of the encoded image, decoded."""
    channels = self._params.num_channels

    def _Jpeg():
      shape = tf.image.extract_jpeg_shape(encoded)[:2]
      window = self._CropWindow(shape, seed)
      return tf.image.decode_and_crop_jpeg(encoded, window, channels=channels)

    def _Other():
      image = tf.io.decode_image(encoded, channels=channels,
                                 expand_animations=False)
      window = self._CropWindow(tf.shape(image)[:2], seed)
      return tf.slice(image, tf.concat([window[:2], [0]], 0),
                      tf.concat([window[2:], [channels]], 0))

    return tf.cond(tf.io.is_jpeg(encoded), _Jpeg, _Other)

  # ---- Loading --------------------------------------------------------------
  def _Layout(self) -> SplitLayout:
    if self._layout is None:
      self._layout = self._LoadLayout()
    return self._layout

  def _LoadLayout(self) -> SplitLayout:
    p = self._params
    builder = self._Builder()
    features = builder.info.features
    known_classes = inputs.CheckFeatureKeys(p, features)
    if not isinstance(features[p.image_key], tfds.features.Image):
      raise inputs.InputConfigError(
          f'{p.name}: feature {p.image_key!r} of {p.dataset_name!r} is a '
          f'{type(features[p.image_key]).__name__}, not an Image.')
    label_info = features[p.label_key].get_serialized_info()
    if label_info.shape != () or not tf.as_dtype(label_info.dtype).is_integer:
      raise inputs.InputConfigError(
          f'{p.name}: feature {p.label_key!r} of {p.dataset_name!r} is not a '
          f'scalar integer class id ({label_info}).')
    self._label_dtype = tf.as_dtype(label_info.dtype)
    inputs.CheckNumClasses(p, known_classes)
    file_format = getattr(builder.info.file_format, 'value',
                          builder.info.file_format)
    if file_format != 'tfrecord':
      raise inputs.InputConfigError(
          f'{p.name}: {p.dataset_name!r} is stored as {file_format!r}; '
          'TFDSStreamingImageInput reads TFRecord files only. Prepare it '
          "with file_format='tfrecord'.")
    try:
      instructions = builder.info.splits[p.split].file_instructions
    except (KeyError, ValueError) as e:
      raise inputs.InputConfigError(
          f'{p.name}: bad split {p.split!r} for {p.dataset_name!r} (splits: '
          f'{sorted(builder.info.splits.keys())}): {e}') from e
    reads = [(f.filename, f.skip,
              f.take if f.take >= 0 else f.examples_in_shard - f.skip)
             for f in instructions]
    layout = PlanBlocks(reads, p.shuffle_block_size)
    if not layout.num_examples:
      raise inputs.InputConfigError(
          f'{p.name}: split {p.split!r} of {p.dataset_name!r} is empty.')
    return layout

  def _Builder(self) -> tfds.core.DatasetBuilder:
    p = self._params
    builder = inputs.TFDSBuilder(
        p, 'Data TFDS has no builder for (e.g. FGVC Aircraft, Birdsnap) can '
        'be written from a folder of images with '
        'gpipe_tf.data.datasets.PrepareImageFolder.')
    if builder.is_prepared():
      return builder
    if p.download:
      builder.download_and_prepare()
      return builder
    raise inputs.DatasetNotFoundError(inputs.NotPreparedMessage(
        p, builder, ' (datasets behind a manual download, like imagenet2012, '
        'need their archives in <data_dir>/downloads/manual first)'))
