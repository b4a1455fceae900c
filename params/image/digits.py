"""A small AmoebaNet-D pipelined over 2 devices, trained on the real 8x8 digits in minutes on a CPU.

``image.digits.AmoebaNetTiny`` is the README's first experiment::

  python -m gpipe_tf.trainer --model=image.digits.AmoebaNetTiny \\
      --logdir=/tmp/digits --max_steps=200

It classifies scikit-learn's bundled UCI digits (1,437 train / 360 test
images, 10 classes, no network needed), upscaled to 16x16 greyscale, with
AmoebaNet-D(3, 32) (3 normal and 2 reduction cells after a 3x3 stem conv; no
stem cells, the images being small; 0.4M parameters) cut into 2 pipeline
cells, 4 micro-batches per batch of 64, rematerialising in the backward pass.
Measured on 2 CPU cores: 97.5% test accuracy after 200 steps, in about 100
seconds, half of which is building the pipelined step (``--graph_optimizer=off``
cuts that by 10-15 s; benchmarks/first_step) (for comparison,
on this split scikit-learn's SVC gets 94% and 3-nearest-neighbours 97%).

The data is written on first use: the input generator (``DigitsInput``) calls
``gpipe_tf.data.datasets.PrepareDigits(data_dir)`` before reading, which stores the
digits as the TFDS dataset 'digits' in data_dir (default DATA_DIR,
~/tensorflow_datasets) unless it is already there; it is offline and
idempotent. Training images are shifted at random by up to 2 pixels
(DigitsInput.max_shift); TFDSImageInput's own augmentation is off because its
horizontal flips would turn digits into other shapes.

Transfer learning, end to end on a CPU (the paper's recipe in miniature):
``AmoebaNetTinyDigits0To5`` pre-trains on the digits 0-5 (6 classes);
``AmoebaNetTinyDigits6To9FineTune`` starts from its checkpoint with a new
4-class softmax layer and trains on the digits 6-9 of a quarter of the
training split; ``AmoebaNetTinyDigits6To9`` is the same run from scratch::

  python -m gpipe_tf.trainer --model=image.digits.AmoebaNetTinyDigits0To5 \
      --logdir=/tmp/d05 --max_steps=200
  python -m gpipe_tf.trainer \
      --model=image.digits.AmoebaNetTinyDigits6To9FineTune \
      --model_params_override="init_from_checkpoint : '/tmp/d05'" \
      --logdir=/tmp/d69 --max_steps=60
"""

from __future__ import annotations

import os

import tensorflow as tf

from gpipe_tf import base_experiment
from gpipe_tf.data import datasets
from gpipe_tf import hyperparams
from gpipe_tf.data import inputs
from gpipe_tf import model_registry
from gpipe_tf.tasks import optimizers
from gpipe_tf.tasks import lr_schedules
from gpipe_tf import tasks
from gpipe_tf.models import amoebanet
from gpipe_tf.pipeline import PipeliningLayer

DATA_DIR = os.path.expanduser(os.path.join('~', 'tensorflow_datasets'))


class DigitsInput(inputs.TFDSImageInput):
  """TFDSImageInput of the 'digits' dataset, which it writes on first use.

  Adds one augmentation that suits digits (TFDSImageInput's also flips):
  with max_shift > 0, every image moves by a random whole number of pixels
  in [-max_shift, max_shift] along each axis, blank (0-valued) pixels
  filling in. Drawn statelessly from the batch seed, like the rest.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.dataset_name = datasets.DIGITS_NAME
    p.data_dir = DATA_DIR
    p.Define('max_shift', 0,
             'Largest random shift in output pixels (training); 0: none.')
    return p

  def _LoadExamples(self):
    if self.p.data_dir is None:
      raise inputs.InputConfigError(
          f'{self.p.name}: DigitsInput needs a data_dir to write digits to.')
    datasets.PrepareDigits(self.p.data_dir)
    return super()._LoadExamples()

  def _PreprocessBatch(self, batch, seed):
    out = super()._PreprocessBatch(batch, seed)
    shift = self.p.max_shift
    if not shift:
      return out
    images = out['inputs']
    # The value a blank pixel has after (x - mean) / std.
    blank = -tf.constant(self.p.mean or 0.0) / tf.constant(self.p.std or 1.0)
    padded = tf.pad(images - blank, [[0, 0], [shift, shift], [shift, shift],
                                     [0, 0]]) + blank
    size = images.shape[1]
    offsets = tf.random.stateless_uniform(
        tf.stack([tf.shape(images)[0], 2]),
        tf.random.experimental.stateless_fold_in(seed, 1),
        minval=0, maxval=2 * shift + 1, dtype=tf.int32)
    rows = offsets[:, :1] + tf.range(size)  # [B, size]
    cols = offsets[:, 1:] + tf.range(size)
    moved = tf.gather(padded, rows, axis=1, batch_dims=1)
    out['inputs'] = tf.gather(moved, cols, axis=2, batch_dims=1)
    return out


@model_registry.RegisterSingleTaskModel
class AmoebaNetTiny(base_experiment.SingleTaskModelParams):
  """AmoebaNet-D(3, 32) on 16x16 digits, K=2 cells, M=4 micro-batches."""

  DATA_DIR = DATA_DIR
  IMAGE_SIZE = 16
  NUM_CLASSES = 10
  NUM_NORMAL_LAYERS = 3
  NUM_FILTERS = 32
  STEM_FILTERS = 16
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 4
  BATCH_SIZE = 64
  MAX_SHIFT = 2  # Training images move by up to 2 of 16 pixels.
  CLASSES = None  # Stored digits to keep (relabelled 0..n-1); None: all.
  TRAIN_SPLIT = 'train'
  LEARNING_RATE = 3e-3
  WARMUP_STEPS = 40
  TOTAL_STEPS = 200  # The schedule's end; train with --max_steps=200.

  def _Input(self, name: str, split: str) -> hyperparams.Params:
    return DigitsInput.Params().Set(
        name=name, split=split, data_dir=self.DATA_DIR,
        image_size=self.IMAGE_SIZE, num_channels=1, mean=(0.5,), std=(0.5,),
        num_classes=self.NUM_CLASSES, batch_size=self.BATCH_SIZE,
        class_subset=None if self.CLASSES is None else list(self.CLASSES))

  def Train(self) -> hyperparams.Params:
    return self._Input('train', self.TRAIN_SPLIT).Set(
        shuffle=True, repeat=True, seed=1, max_shift=self.MAX_SHIFT)

  def Test(self) -> hyperparams.Params:
    # 360 = 5 * 64 + 40: the last batch still splits into 4 micro-batches.
    return self._Input('test', 'test').Set(shuffle=False, repeat=False,
                                           drop_remainder=False)

  def Layers(self) -> list:
    """The AmoebaNet layer Params the pipeline splits."""
    return amoebanet.AmoebaNetD(
        self.NUM_NORMAL_LAYERS, self.NUM_FILTERS, self.NUM_CLASSES,
        self.IMAGE_SIZE, num_input_channels=1, num_stem_cells=0,
        stem_filters=self.STEM_FILTERS, stem_stride=1, dropout_keep_prob=0.8,
        batch_norm_decay=0.9)

  def Task(self) -> hyperparams.Params:
    model = PipeliningLayer.Params().Set(
        name='model', layers=self.Layers(),
        num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES, remat='always',
        input_shapes=[(None, self.IMAGE_SIZE, self.IMAGE_SIZE, 1)])
    p = tasks.ClassificationTask.Params().Set(
        model=model, label_smoothing=0.1, clip_gradient_norm_to_value=5.0,
        random_seed=1)
    p.optimizer = optimizers.Adam.Params()
    p.learning_rate_schedule = lr_schedules.Cosine.Params().Set(
        learning_rate=self.LEARNING_RATE, warmup_steps=self.WARMUP_STEPS,
        total_steps=self.TOTAL_STEPS, final_learning_rate=0.0)
    return p


@model_registry.RegisterSingleTaskModel
class AmoebaNetTinyDigits0To5(AmoebaNetTiny):
  """AmoebaNetTiny on the digits 0-5 only: the pre-training of the demo."""
  CLASSES = (0, 1, 2, 3, 4, 5)
  NUM_CLASSES = 6


@model_registry.RegisterSingleTaskModel
class AmoebaNetTinyDigits6To9(AmoebaNetTiny):
  """From scratch on the digits 6-9 of the first quarter of the training split.

  About 140 training images, 60 steps: the baseline of the fine-tuning demo.
  """
  CLASSES = (6, 7, 8, 9)
  NUM_CLASSES = 4
  TRAIN_SPLIT = 'train[:25%]'
  LEARNING_RATE = 1e-3
  WARMUP_STEPS = 10
  TOTAL_STEPS = 60


@model_registry.RegisterSingleTaskModel
class AmoebaNetTinyDigits6To9FineTune(AmoebaNetTinyDigits6To9):
  """AmoebaNetTinyDigits6To9 initialised from an AmoebaNetTinyDigits0To5 run.

  Every variable but the softmax layer (6 classes there, 4 here) comes from
  INIT_FROM_CHECKPOINT, the pre-training run's logdir; set it here or with
  --model_params_override="init_from_checkpoint : '<logdir>'".
  """
  INIT_FROM_CHECKPOINT = None
  INIT_FROM_CHECKPOINT_SKIP = (r'^task/model/head/logits/',)

  def Task(self) -> hyperparams.Params:
    p = super().Task()
    p.init_from_checkpoint = self.INIT_FROM_CHECKPOINT
    p.init_from_checkpoint_skip = list(self.INIT_FROM_CHECKPOINT_SKIP)
    return p
