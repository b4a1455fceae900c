"""Input generators: Params-declared tf.data pipelines of batches, seeded and resumable.

Every generator holds its N examples in host memory (decoded: images as uint8)
and gathers them by index, a whole batch at a time. That is what makes the
stream exactly reproducible and cheap to resume. Epoch e visits all N examples
in the order perm_e, a permutation drawn statelessly from (seed, e) (identity
when shuffle is off). With repeat the epochs follow each other without a gap,
and batch b is stream positions [b*B, (b+1)*B) (B = batch_size), so a batch can
hold the end of one epoch and the start of the next::

  position  0 ........ N-1 | N ....... 2N-1 | 2N ...
  epoch     0              | 1              | 2 ...
  example   perm_0[0..N-1] | perm_1[0..N-1] | perm_2 ...
  batches   |-- 0 --|-- 1 --|-- 2 --|-- 3 --|-- ...      (B consecutive positions)

``GetDataset(skip_batches=k)`` starts at position k*B: it computes perm_e for
e = k*B // N, slices it at k*B % N and goes on from there. No example before
position k*B is gathered or augmented, so resuming costs one permutation of N
indices (a sort), not k batches. Augmentation of batch b is drawn statelessly
from (seed, b), so a resumed stream repeats the very same crops and flips.
Neither the order nor the augmentation depends on TensorFlow's global seed
(``tf.random.set_seed``) or on how many datasets were built before; they do
depend on every Params field, batch_size included.

Generators deliberately do NOT stream data larger than memory: there is no
shuffle buffer (each epoch is a full permutation). This suits the datasets a
2-core CPU host trains on (digits, MNIST, CIFAR: 150 MB decoded). Data of
ImageNet size, or images of varying sizes, stream through
``gpipe_tf.data.streaming_inputs.TFDSStreamingImageInput`` instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from gpipe_tf import errors
from gpipe_tf import hyperparams

__all__ = ['BaseInputGenerator', 'CheckFeatureKeys', 'CheckNumClasses',
           'CheckTFDSImageParams', 'Cutout', 'DatasetNotFoundError',
           'DefineTFDSImageParams', 'InputConfigError', 'NotPreparedMessage',
           'SyntheticClassificationInput', 'TFDSBuilder', 'TFDSImageInput']

# Salts that keep the shuffle and the augmentation streams of one seed apart.
_SHUFFLE_SALT = 0x5348
_AUGMENT_SALT = 0x4147


class DatasetNotFoundError(errors.Error, FileNotFoundError):
  """A dataset is not prepared in data_dir and download is off."""


class InputConfigError(errors.Error, ValueError):
  """Input Params that cannot work (bad size, unknown feature key, ...)."""


class BaseInputGenerator:
  """Base class: a seeded, resumable stream of batches from in-memory examples.

  Subclasses implement ``_LoadExamples()`` (all N examples as a dict of arrays
  with N first; called once, on first use) and may override
  ``_PreprocessBatch(batch, seed)`` (gathered examples to output features,
  vectorised over the batch). See the module docstring for the stream layout
  and what ``skip_batches`` costs. The data is loaded on the first
  NumExamples() or GetDataset() call, not in the constructor.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', cls.__name__, 'Name of this input generator.')
    p.Define('batch_size', 32,
             'Global batch size: examples per batch over all replicas and '
             'micro-batches.')
    p.Define('shuffle', True,
             'Visit each epoch in a fresh order drawn from (seed, epoch). '
             'False: dataset order every epoch.')
    p.Define('repeat', True,
             'True (training): endless stream of epochs. False (evaluation): '
             'one pass over the data.')
    p.Define('seed', 0,
             'Seed of the shuffle order and of augmentation; the stream is a '
             'pure function of the Params.')
    p.Define('drop_remainder', True,
             'Drop a final batch smaller than batch_size (only reachable when '
             'repeat is False); keeps the batch dimension static.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams) -> None:
    p = params.Copy()
    p.Freeze()
    self._params = p
    if not isinstance(p.batch_size, int) or p.batch_size < 1:
      raise InputConfigError(
          f'{p.name}: batch_size must be a positive int, got {p.batch_size!r}.')
    if not isinstance(p.seed, int) or not 0 <= p.seed < 2**63:
      raise InputConfigError(
          f'{p.name}: seed must be an int in [0, 2**63), got {p.seed!r}.')
    self._examples: dict[str, tf.Tensor] | None = None
    self._num_examples = 0

  @property
  def params(self) -> hyperparams.InstantiableParams:
    """This generator's Params (a frozen copy)."""
    return self._params

  @property
  def p(self) -> hyperparams.InstantiableParams:
    return self._params

  def NumExamples(self) -> int:
    """N, the number of examples in one epoch (loads the data if needed)."""
    self._EnsureLoaded()
    return self._num_examples

  def GetDataset(self, skip_batches: int = 0) -> tf.data.Dataset:
    """The stream of batches from batch index `skip_batches` on.

    Args:
      skip_batches: index of the first batch to yield. The result equals the
        uninterrupted stream (``GetDataset()``) with its first `skip_batches`
        batches dropped, element for element, also across epoch boundaries.
        A trainer resuming after S steps passes S. Cost: one permutation of N
        indices; skipped examples are never read. With repeat False, skipping
        past the end gives an empty dataset.

    Returns:
      A tf.data.Dataset of dicts of tensors, batch dimension first.
    """
    if not isinstance(skip_batches, int) or skip_batches < 0:
      raise ValueError(
          f'skip_batches must be a non-negative int, got {skip_batches!r}.')
    self._EnsureLoaded()
    p = self._params
    n = self._num_examples
    first_epoch, offset = divmod(skip_batches * p.batch_size, n)
    if p.repeat:
      epochs = tf.data.Dataset.counter(first_epoch)
    else:
      epochs = tf.data.Dataset.range(first_epoch, 1)

    @tf.autograph.experimental.do_not_convert  # Plain graph code: fast trace.
    def _EpochSlice(epoch):
      """Indices and stream positions of `epoch`, from the resume point on."""
      start = tf.where(epoch == first_epoch, tf.constant(offset, tf.int64), 0)
      return (self._EpochOrder(epoch)[start:],
              epoch * n + tf.range(start, n, dtype=tf.int64))

    examples = self._examples
    augment_seed = tf.constant([p.seed, _AUGMENT_SALT], tf.int64)

    @tf.autograph.experimental.do_not_convert
    def _Batch(indices, positions):
      batch = {k: tf.gather(v, indices) for k, v in examples.items()}
      batch_index = positions[0] // p.batch_size
      seed = tf.random.experimental.stateless_fold_in(augment_seed,
                                                      batch_index)
      return self._PreprocessBatch(batch, seed)

    # One element per epoch, cut into batches across epoch boundaries: the
    # only per-example work in the pipeline is inside _PreprocessBatch.
    ds = epochs.map(_EpochSlice)
    ds = ds.rebatch(p.batch_size, drop_remainder=p.drop_remainder)
    ds = ds.map(_Batch, num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)

  # ---- Subclass hooks -----------------------------------------------------
  def _LoadExamples(self) -> dict[str, Any]:
    """All examples: a dict of arrays (or tensors) sharing leading dim N."""
    raise NotImplementedError

  def _PreprocessBatch(self, batch: dict[str, tf.Tensor],
                       seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """Gathered examples (batch first) to output features.

    `seed` ([2] int64) is drawn from (Params.seed, batch index): the stateless
    seed for any randomness (augmentation), the same in a resumed stream.
    """
    del seed
    return batch

  # ---- Internals ----------------------------------------------------------
  def _EnsureLoaded(self) -> None:
    if self._examples is not None:
      return
    arrays = self._LoadExamples()
    sizes = {k: int(np.shape(v)[0]) for k, v in arrays.items()}
    if len(set(sizes.values())) != 1:
      raise InputConfigError(
          f'{self._params.name}: features disagree on the example count: '
          f'{sizes}.')
    n = next(iter(sizes.values()))
    if n == 0:
      raise InputConfigError(f'{self._params.name}: the data has no examples.')
    self._examples = {k: tf.convert_to_tensor(v) for k, v in arrays.items()}
    self._num_examples = n

  def _EpochOrder(self, epoch: tf.Tensor) -> tf.Tensor:
    """Example indices of `epoch` in visiting order (int64 [N])."""
    n = self._num_examples
    if not self._params.shuffle:
      return tf.range(n, dtype=tf.int64)
    seed = tf.random.experimental.stateless_fold_in(
        tf.constant([self._params.seed, _SHUFFLE_SALT], tf.int64), epoch)
    keys = tf.random.stateless_uniform([n], seed=seed, minval=None,
                                       maxval=None, dtype=tf.int64)
    return tf.cast(tf.argsort(keys, stable=True), tf.int64)


class SyntheticClassificationInput(BaseInputGenerator):
  """Gaussian inputs labelled by a fixed random linear teacher.

  x ~ N(0, I) in R^input_dim (drawn from data_seed); labels =
  argmax(x @ W + noise * N(0, I)) with W a fixed [input_dim, num_classes]
  matrix of unit-norm Gaussian columns drawn from teacher_seed, so classes are
  balanced in expectation and a linear model or small MLP can learn them
  (perfectly when noise is 0). A held-out set: same teacher_seed, another
  data_seed. Elements: {'inputs': float32 [B, input_dim], 'labels': int32 [B]}.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('num_examples', 1024, 'Examples per epoch.')
    p.Define('input_dim', 16, 'Dimension of the inputs.')
    p.Define('num_classes', 4, 'Number of classes (>= 2).')
    p.Define('noise', 0.0,
             'Std of Gaussian noise added to the teacher logits (label noise).')
    p.Define('data_seed', 0, 'Seed of the inputs and of the label noise.')
    p.Define('teacher_seed', 0,
             'Seed of the teacher W; keep it when drawing a held-out set with '
             'another data_seed.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams) -> None:
    super().__init__(params)
    p = self._params
    for field, low in (('num_examples', 1), ('input_dim', 1),
                       ('num_classes', 2)):
      value = getattr(p, field)
      if not isinstance(value, int) or value < low:
        raise InputConfigError(
            f'{p.name}: {field} must be an int >= {low}, got {value!r}.')

  def _LoadExamples(self) -> dict[str, Any]:
    p = self._params
    teacher = np.random.default_rng(p.teacher_seed).standard_normal(
        (p.input_dim, p.num_classes))
    teacher /= np.linalg.norm(teacher, axis=0, keepdims=True)
    rng = np.random.default_rng(p.data_seed)
    inputs = rng.standard_normal((p.num_examples, p.input_dim))
    logits = inputs @ teacher
    if p.noise:
      logits += p.noise * rng.standard_normal(logits.shape)
    return {'inputs': inputs.astype(np.float32),
            'labels': np.argmax(logits, axis=1).astype(np.int32)}


# ---- TFDS image sources: what TFDSImageInput and -------------------------
# ---- streaming_inputs.TFDSStreamingImageInput share ------------------------


def DefineTFDSImageParams(p: hyperparams.InstantiableParams,
                          keep_stored: bool) -> None:
  """Defines the Params fields every TFDS image input has, in this order.

  Which dataset, split and features are read (dataset_name, split, data_dir,
  download, image_key, label_key), the output image (image_size,
  num_channels, augment, cutout_size, mean, std) and the class check
  (num_classes). The inputs then define their own fields after these.

  Args:
    p: the input generator's Params.
    keep_stored: whether image_size and num_channels may be None, meaning the
      stored size and channels are kept (their default then); else they
      default to 224 and 3.
  """
  p.Define('dataset_name', None,
           "TFDS name, optionally with config/version ('cifar10', "
           "'mnist:3.*.*', 'oxford_iiit_pet:4.*.*', 'digits').")
  p.Define('split', 'train',
           "TFDS split string: 'train', 'test', 'validation', "
           "'train[:90%]', ...")
  p.Define('data_dir', None, 'TFDS data directory; None: the TFDS default.')
  p.Define('download', False,
           'Download and prepare the dataset if missing (needs network; '
           'ImageNet needs a manual download anyway). False: raise '
           'DatasetNotFoundError instead.')
  p.Define('image_key', 'image', 'Feature holding the image.')
  p.Define('label_key', 'label', 'Feature holding the class id.')
  p.Define('image_size', None if keep_stored else 224,
           'Output height = width (bilinear resize).' +
           (' None: keep the stored size.' if keep_stored else ''))
  p.Define('num_channels', None if keep_stored else 3,
           'Output channels (1 or 3), converting grey <-> RGB.' +
           (' None: keep the stored ones.' if keep_stored else ''))
  p.Define('augment', False,
           'Training preprocessing: a random crop (resized to image_size) '
           'and a random horizontal flip. False: no randomness.')
  p.Define('cutout_size', 0,
           'With augment: side of a square set to 0 after normalisation (in '
           'output pixels); 0 = off.')
  p.Define('mean', None,
           'Per-channel mean on the [0, 1] scale, subtracted; None: 0.')
  p.Define('std', None,
           'Per-channel std on the [0, 1] scale, divided by; None: 1.')
  p.Define('num_classes', None,
           'Expected number of classes; checked against the label feature '
           'and the labels. None: no check.')


def CheckTFDSImageParams(p: hyperparams.InstantiableParams,
                         keep_stored: bool) -> None:
  """Checks the fields DefineTFDSImageParams defined (before any reading).

  Raises:
    InputConfigError: naming the field and the value that cannot work.
  """

  def _Check(ok: bool, what: str) -> None:
    if not ok:
      raise InputConfigError(f'{p.name}: {what}')

  optional = ' or None' if keep_stored else ''
  _Check(bool(p.dataset_name), 'set dataset_name.')
  _Check((keep_stored and p.image_size is None) or (
      isinstance(p.image_size, int) and p.image_size >= 1),
         f'image_size must be a positive int{optional}, got '
         f'{p.image_size!r}.')
  _Check(p.num_channels in ((None, 1, 3) if keep_stored else (1, 3)),
         f'num_channels must be 1, 3{optional}, got {p.num_channels!r}.')
  _Check(isinstance(p.cutout_size, int) and p.cutout_size >= 0,
         f'cutout_size must be an int >= 0, got {p.cutout_size!r}.')
  for field in ('mean', 'std'):
    values = getattr(p, field)
    _Check(values is None or p.num_channels is None or
           len(values) == p.num_channels,
           f'{field} needs {p.num_channels} values, got {values!r}.')
  _Check(p.std is None or all(s > 0 for s in p.std),
         f'std must be positive, got {p.std!r}.')


def TFDSBuilder(p: hyperparams.InstantiableParams,
                hint: str) -> tfds.core.DatasetBuilder:
  """``tfds.builder(p.dataset_name, data_dir=p.data_dir)``, or a named error.

  Raises:
    DatasetNotFoundError: no TFDS dataset of that name, and none prepared in
      data_dir; the message ends with `hint` (how to write one).
  """
  try:
    return tfds.builder(p.dataset_name, data_dir=p.data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise DatasetNotFoundError(
        f'{p.name}: {p.dataset_name!r} is neither a TFDS dataset name nor '
        f'a dataset prepared in data_dir {_DataDir(p)}. Check dataset_name '
        f'and data_dir. {hint}') from e


def NotPreparedMessage(p: hyperparams.InstantiableParams,
                       builder: tfds.core.DatasetBuilder,
                       manual_note: str = '') -> str:
  """What DatasetNotFoundError says of a known dataset that is not prepared."""
  where = _DataDir(p)
  return (f'{p.name}: TFDS dataset {p.dataset_name!r} is not prepared in '
          f'data_dir {where} (looked for {builder.data_dir}) and download is '
          'False. Prepare it: pass download=True on a machine with network '
          f'access{manual_note}, or prepare it elsewhere and copy its '
          f'<name>/<version> folder into {where}.')


def CheckFeatureKeys(p: hyperparams.InstantiableParams,
                     features: Any) -> int | None:
  """Checks that image_key and label_key name features; returns the classes.

  Returns:
    The label feature's num_classes, or None if it does not say.

  Raises:
    InputConfigError: a key names no feature.
  """
  for key in (p.image_key, p.label_key):
    if key not in features:
      raise InputConfigError(
          f'{p.name}: dataset {p.dataset_name!r} has no feature {key!r}; '
          f'its features are {sorted(features.keys())}. Set image_key / '
          'label_key.')
  return getattr(features[p.label_key], 'num_classes', None)


def CheckNumClasses(p: hyperparams.InstantiableParams,
                    known_classes: int | None) -> None:
  """Raises InputConfigError if num_classes and the dataset's disagree."""
  if p.num_classes is not None and known_classes not in (None, p.num_classes):
    raise InputConfigError(
        f'{p.name}: num_classes is {p.num_classes} but {p.dataset_name!r} '
        f'has {known_classes} classes.')


def _DataDir(p: hyperparams.InstantiableParams) -> str:
  return p.data_dir or tfds.core.constants.DATA_DIR


class TFDSImageInput(BaseInputGenerator):
  """An image classification split read through TensorFlow Datasets.

  Loading: ``tfds.builder(dataset_name, data_dir=data_dir)``, then
  ``download_and_prepare()`` only if download is True, then
  ``as_dataset(split, shuffle_files=False)`` read once, in file order, into
  host memory as decoded uint8 images; this class then shuffles (module
  docstring). Datasets the project writes itself
  (``gpipe_tf.data.datasets.PrepareDigits``) are read through the same calls.
  Images must share one stored size (true of MNIST, CIFAR, SVHN, digits...);
  variable-size datasets are deliberately NOT supported here (they stream
  through ``streaming_inputs.TFDSStreamingImageInput``). With class_subset,
  only examples of the listed classes are kept, relabelled 0..n-1 in list
  order (e.g. pre-train on digits 0-5, fine-tune on 6-9).

  Per batch: convert channels (num_channels), scale to [0, 1]; with augment, a
  random square crop of side fraction in [crop_min_fraction, 1] at a random
  place, resized (bilinear) to image_size, and a random horizontal flip;
  without augment, a resize of the whole image to image_size (if set). Then
  (x - mean) / std per channel with mean/std on the [0, 1] scale, then (augment
  and cutout_size > 0) a cutout_size square centred on a random pixel, clipped
  at the border, set to 0. Randomness is drawn per example from the batch seed.
  Elements: {'inputs': float32 [B, S, S, C], 'labels': int32 [B]}.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    DefineTFDSImageParams(p, keep_stored=True)
    p.Define('crop_min_fraction', 0.75,
             'With augment: smallest crop side as a fraction of the image.')
    p.Define('class_subset', None,
             'Stored class ids to keep, relabelled 0..n-1 in this order; '
             'other examples are dropped. None: all classes.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams) -> None:
    super().__init__(params)
    p = self._params
    CheckTFDSImageParams(p, keep_stored=True)
    if not 0.0 < p.crop_min_fraction <= 1.0:
      raise InputConfigError(
          f'{p.name}: crop_min_fraction must be in (0, 1], got '
          f'{p.crop_min_fraction!r}.')
    subset = p.class_subset
    if subset is not None and (
        not subset or len(set(subset)) != len(subset) or
        not all(isinstance(c, int) and c >= 0 for c in subset)):
      raise InputConfigError(
          f'{p.name}: class_subset must be distinct class ids >= 0, got '
          f'{subset!r}.')
    if subset is not None and p.num_classes not in (None, len(subset)):
      raise InputConfigError(
          f'{p.name}: num_classes is {p.num_classes} but class_subset keeps '
          f'{len(subset)} classes.')
    self._stored_channels = 0  # Known after loading.

  def _Builder(self) -> tuple[tfds.core.DatasetBuilder, str | None]:
    """The TFDS builder, and the error message to raise if as_dataset fails."""
    p = self._params
    builder = TFDSBuilder(
        p, 'Write a project dataset first (gpipe_tf.data.datasets.'
        f"PrepareDigits(data_dir) for 'digits') or copy a prepared "
        f'<name>/<version> folder into {_DataDir(p)}.')
    if p.download:
      builder.download_and_prepare()
      return builder, None
    if builder.is_prepared():
      return builder, None
    # Under tfds.testing.mock_data is_prepared() is False but as_dataset
    # works, so only as_dataset's own failure decides.
    return builder, NotPreparedMessage(p, builder)

  def _LoadExamples(self) -> dict[str, Any]:
    p = self._params
    builder, missing_message = self._Builder()
    features = builder.info.features
    known_classes = CheckFeatureKeys(p, features)
    shape = tuple(features[p.image_key].shape)
    if len(shape) != 3 or None in shape:
      raise InputConfigError(
          f'{p.name}: feature {p.image_key!r} of {p.dataset_name!r} has shape '
          f'{shape}; TFDSImageInput needs one fixed [height, width, channels] '
          'for all images.')
    self._stored_channels = shape[2]
    out_channels = p.num_channels or shape[2]
    if shape[2] != out_channels and {shape[2], out_channels} != {1, 3}:
      raise InputConfigError(
          f'{p.name}: cannot convert {shape[2]} channels to {out_channels}.')
    for field in ('mean', 'std'):
      values = getattr(p, field)
      if values is not None and len(values) != out_channels:
        raise InputConfigError(
            f'{p.name}: {field} has {len(values)} values for {out_channels} '
            'output channels.')
    if p.class_subset is None:
      CheckNumClasses(p, known_classes)
    elif known_classes is not None and max(p.class_subset) >= known_classes:
      raise InputConfigError(
          f'{p.name}: class_subset {p.class_subset} names classes beyond '
          f'the {known_classes} of {p.dataset_name!r}.')
    try:
      ds = builder.as_dataset(
          split=p.split, shuffle_files=False,
          read_config=tfds.ReadConfig(interleave_cycle_length=1))
    except AssertionError as e:
      if missing_message:
        raise DatasetNotFoundError(missing_message) from e
      raise
    images, labels = [], []
    for chunk in ds.batch(4096).as_numpy_iterator():
      images.append(chunk[p.image_key])
      labels.append(chunk[p.label_key])
    if not images:
      raise InputConfigError(
          f'{p.name}: split {p.split!r} of {p.dataset_name!r} is empty.')
    labels = np.concatenate(labels).astype(np.int32)
    images = np.concatenate(images)
    if p.class_subset is not None:
      new_label = {c: i for i, c in enumerate(p.class_subset)}
      keep = np.isin(labels, p.class_subset)
      if not keep.any():
        raise InputConfigError(
            f'{p.name}: split {p.split!r} of {p.dataset_name!r} has no '
            f'example of class_subset {p.class_subset}.')
      images = images[keep]
      labels = np.array([new_label[c] for c in labels[keep]], np.int32)
    limit = p.num_classes or known_classes
    if limit is not None and (labels.min() < 0 or labels.max() >= limit):
      raise InputConfigError(
          f'{p.name}: labels of {p.dataset_name!r} lie in [{labels.min()}, '
          f'{labels.max()}], outside [0, {limit}).')
    return {'images': images, 'labels': labels}

  def _PreprocessBatch(self, batch: dict[str, tf.Tensor],
                       seed: tf.Tensor) -> dict[str, tf.Tensor]:
    p = self._params
    images = batch['images']
    if p.num_channels == 3 and self._stored_channels == 1:
      images = tf.image.grayscale_to_rgb(images)
    elif p.num_channels == 1 and self._stored_channels == 3:
      images = tf.image.rgb_to_grayscale(images)
    images = tf.cast(images, tf.float32) / 255.0
    crop_seed, flip_seed, cutout_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 3))
    size = p.image_size
    if p.augment:
      out_size = [size, size] if size else images.shape[1:3].as_list()
      images = _RandomCropResize(images, out_size, p.crop_min_fraction,
                                 crop_seed)
      images = _RandomFlip(images, flip_seed)
    elif size:
      images = tf.image.resize(images, [size, size])
    if p.mean is not None:
      images -= tf.constant(p.mean, tf.float32)
    if p.std is not None:
      images /= tf.constant(p.std, tf.float32)
    if p.augment and p.cutout_size:
      images = Cutout(images, p.cutout_size, cutout_seed)
    return {'inputs': images, 'labels': batch['labels']}


def _RandomCropResize(images: tf.Tensor, size: list[int], min_fraction: float,
                      seed: tf.Tensor) -> tf.Tensor:
  """Per image: a random square-fraction crop resized (bilinear) to `size`."""
  batch = tf.shape(images)[:1]
  side_seed, corner_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 2))
  side = tf.random.stateless_uniform(batch, side_seed, minval=min_fraction,
                                     maxval=1.0)
  corner = tf.random.stateless_uniform(tf.concat([batch, [2]], 0),
                                       corner_seed) * (1.0 - side)[:, None]
  # Bilinear resampling is separable: out = Ry @ image @ Rx^T per channel.
  rows = _InterpolationMatrix(corner[:, 0], side, size[0], images.shape[1])
  cols = _InterpolationMatrix(corner[:, 1], side, size[1], images.shape[2])
  return tf.einsum('bsh,bhwc,btw->bstc', rows, images, cols)


def _InterpolationMatrix(start: tf.Tensor, extent: tf.Tensor, out_size: int,
                         in_size: int) -> tf.Tensor:
  """[B, out_size, in_size] weights sampling [start, start + extent] (as
  fractions of the axis) at out_size evenly spaced points, bilinearly."""
  steps = tf.linspace(0.0, 1.0, out_size) if out_size > 1 else tf.constant(
      [0.5])
  coords = (start[:, None] + extent[:, None] * steps) * (in_size - 1)
  pixels = tf.range(in_size, dtype=tf.float32)
  return tf.nn.relu(1.0 - tf.abs(coords[:, :, None] - pixels))


def _RandomFlip(images: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """Mirrors each image left-right with probability 1/2."""
  flip = tf.random.stateless_uniform(tf.shape(images)[:1], seed) < 0.5
  return tf.where(flip[:, tf.newaxis, tf.newaxis, tf.newaxis],
                  tf.reverse(images, axis=[2]), images)


def Cutout(images: tf.Tensor, side: int, seed: tf.Tensor) -> tf.Tensor:
  """Per image of [B, H, W, C]: zeroes a `side` square centred on a random
  pixel (clipped at the border), drawn statelessly from `seed`."""
  shape = tf.shape(images)
  centers = tf.random.stateless_uniform(
      [shape[0], 2], seed, minval=0, maxval=tf.int32.max, dtype=tf.int32)
  top_left = centers % shape[1:3] - side // 2
  rows = tf.range(shape[1])[tf.newaxis, :] - top_left[:, :1]  # [B, H]
  cols = tf.range(shape[2])[tf.newaxis, :] - top_left[:, 1:]  # [B, W]
  in_rows = (rows >= 0) & (rows < side)
  in_cols = (cols >= 0) & (cols < side)
  inside = in_rows[:, :, tf.newaxis] & in_cols[:, tf.newaxis, :]
  return images * tf.cast(~inside, images.dtype)[..., tf.newaxis]
