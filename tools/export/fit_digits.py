"""Trains AmoebaNet on the bundled digits with Keras's model.fit over a pipeline, and prints the validation accuracy.

::

  python -m tools.export.fit_digits --epochs=5

The model is image.digits.AmoebaNetTiny's layer list (AmoebaNet-D(3, 32) on
16x16 digits) in a PipeliningLayer of K cells (--num_partitions, default 2)
and M micro-batches (--micro_batches), wrapped in
gpipe_tf.train.keras_model.PipelineModel and trained by ``model.fit`` with
the loss inside the pipeline (--schedule: any registered schedule, default
1f1b), Keras's Adam on a cosine decay, sparse cross-entropy and accuracy,
validating on the 360 test digits after every epoch. The digits are written
offline as the TFDS dataset 'digits' in --data_dir on first use
(gpipe_tf.data.datasets.PrepareDigits). On a host without GPU or TPU the CPU
is split into K logical devices first. With --logdir, Keras's TensorBoard
callback writes there and ModelCheckpoint saves the weights of every epoch.

It ends by printing ``Validation accuracy after N epochs: 0.9xxx``.
"""

from __future__ import annotations

import os
from typing import Sequence

from absl import app
from absl import flags
from absl import logging

__all__ = ['DefineFlags', 'Run']


def DefineFlags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines this tool's flags on `flag_values` (only when run as a script)."""
  define = dict(flag_values=flag_values)
  flags.DEFINE_integer('epochs', 5, 'Epochs of --steps_per_epoch steps.',
                       **define)
  flags.DEFINE_integer('steps_per_epoch', 0,
                       'Steps per epoch; 0: one pass over the 1,437 '
                       'training digits.', **define)
  flags.DEFINE_integer('batch_size', 64, 'Examples per step.', **define)
  flags.DEFINE_integer('num_partitions', 2, 'K: pipeline cells.', **define)
  flags.DEFINE_integer('micro_batches', 4, 'M: micro-batches per batch.',
                       **define)
  flags.DEFINE_string('schedule', '1f1b', 'Pipeline schedule.', **define)
  flags.DEFINE_integer('normal_cells', 3, 'AmoebaNet-D normal cells (L).',
                       **define)
  flags.DEFINE_integer('filters', 32, 'AmoebaNet-D filters (D).', **define)
  flags.DEFINE_float('learning_rate', 3e-3, 'Initial Adam learning rate.',
                     **define)
  flags.DEFINE_string('data_dir', None, 'TFDS data directory of the digits; '
                      'default: ~/tensorflow_datasets.', **define)
  flags.DEFINE_string('logdir', None, 'Optional: TensorBoard logs and '
                      'per-epoch weights go here.', **define)


def _SplitCpu(num_devices: int) -> None:
  """K logical CPU devices when there is no accelerator (before any op)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.runtime import devices  # pylint: disable=g-import-not-at-top
  if num_devices <= 1 or tf.config.list_physical_devices('GPU') or (
      tf.config.list_physical_devices('TPU')):
    return
  try:
    logging.info('Split the CPU into %s', devices.SplitCpu(num_devices))
  except devices.DeviceConfigError:  # TensorFlow started already.
    logging.warning('Keeping the devices TensorFlow already has: %s',
                    devices.DefaultDevices())


def Run(flag_values: flags.FlagValues = flags.FLAGS) -> float:
  """Trains as the flags say; returns the last validation accuracy."""
  fv = flag_values
  _SplitCpu(fv.num_partitions)
  # Imported after the split: the devices are fixed when TensorFlow starts.
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.data import datasets  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
  from gpipe_tf.train import keras_model  # pylint: disable=g-import-not-at-top
  from params.image import digits  # pylint: disable=g-import-not-at-top

  experiment = type('FitDigits', (digits.AmoebaNetTiny,), dict(
      NUM_NORMAL_LAYERS=fv.normal_cells, NUM_FILTERS=fv.filters,
      BATCH_SIZE=fv.batch_size,
      DATA_DIR=fv.data_dir or digits.AmoebaNetTiny.DATA_DIR))()
  params = experiment.ExperimentParams()
  split = lambda b: (b['inputs'], b['labels'])
  train = params.train.Instantiate().GetDataset().map(split)  # Repeats.
  # 360 = 5 x 64 + 40: a known count spares Keras a warning when it ends.
  test = params.test.Instantiate().GetDataset().map(split).apply(
      tf.data.experimental.assert_cardinality(
          -(-datasets.DIGITS_NUM_TEST // fv.batch_size)))
  steps_per_epoch = fv.steps_per_epoch or (
      datasets.DIGITS_NUM_TRAIN // fv.batch_size)

  model = keras_model.PipelineModel(PipeliningLayer.Params().Set(
      name='model', layers=experiment.Layers(),
      num_partitions=fv.num_partitions, num_micro_batches=fv.micro_batches,
      schedule=fv.schedule, remat='always',
      input_shapes=[(None, experiment.IMAGE_SIZE, experiment.IMAGE_SIZE, 1)]),
      seed=1)
  logging.info('Pipeline: balance %s on %s, schedule %s', model.layer.balance,
               model.layer.devices, fv.schedule)
  learning_rate = keras.optimizers.schedules.CosineDecay(
      fv.learning_rate, decay_steps=fv.epochs * steps_per_epoch)
  model.compile(keras.optimizers.Adam(learning_rate, global_clipnorm=5.0),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=['accuracy'])
  callbacks = []
  if fv.logdir:
    callbacks = [keras.callbacks.TensorBoard(fv.logdir),
                 keras.callbacks.ModelCheckpoint(
                     os.path.join(fv.logdir, 'epoch{epoch}.weights.h5'),
                     save_weights_only=True)]
  history = model.fit(train, validation_data=test, epochs=fv.epochs,
                      steps_per_epoch=steps_per_epoch, callbacks=callbacks,
                      shuffle=False,  # DigitsInput shuffles (seeded).
                      verbose=2)
  return float(history.history['val_accuracy'][-1])


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  accuracy = Run()
  print(f'Validation accuracy after {flags.FLAGS.epochs} epochs: '
        f'{accuracy:.4f}')


if __name__ == '__main__':
  DefineFlags()
  app.run(main)
