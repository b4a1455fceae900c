"""AmoebaNet on ImageNet 2012, pipelined: the GPipe paper's Table 1 models, AmoebaNet-B(18, 512), and the base of its fine-tuning runs.

``image.imagenet.AmoebaNetD_<L>_<D>`` are the AmoebaNet-D(L, D) rows of
Table 1 (224x224 images, 8 pipeline cells); ``AmoebaNetB_18_512`` is the
557M-parameter model trained on 480x480 images on 4 cells. All share
``AmoebaNetImageNet``: vary a model by subclassing and changing its class
attributes (CELLS, NUM_NORMAL_LAYERS, NUM_FILTERS, IMAGE_SIZE,
NUM_PARTITIONS, NUM_MICRO_BATCHES, BATCH_SIZE, ...).

Training follows the reference recipe (tensorflow/tpu amoeba_net): RMSProp
(decay 0.9, momentum 0.9, epsilon 1.0), a learning rate of 0.0025 per
example of the batch warmed up linearly and then decayed (here: half a
cosine), label smoothing 0.1, gradient clipping at norm 10, dropout 0.5
before the logits. Not reproduced: weight decay, drop path's burn-in, the
auxiliary head and the exponential moving average of the weights.

The data is TFDS 'imagenet2012' prepared in DATA_DIR beforehand (download is
off: ImageNet needs a manual download), streamed from its files by
``streaming_inputs.TFDSStreamingImageInput``: training images get an
Inception-style random crop (8% to 100% of the area, aspect 3/4 to 4/3) and
a flip, evaluation images the central 87.5% crop, both resized to IMAGE_SIZE.

``TransferFromImageNet`` (not registered) is the paper's transfer learning
(Section 4.1, Table 4): AmoebaNet-B(18, 512) at 480x480, initialised from an
ImageNet run's checkpoint (INIT_FROM_CHECKPOINT, see gpipe_tf.train.warm_start)
except the softmax layer, which gets the target's class count, then trained
on the target set. params/image/<dataset>.py subclass it per dataset
(cifar10, cifar100, stanford_cars, oxford_pets, food101, fgvc_aircraft,
birdsnap).
"""

from __future__ import annotations

from gpipe_tf import base_experiment
from gpipe_tf import hyperparams
from gpipe_tf import model_registry
from gpipe_tf.tasks import optimizers
from gpipe_tf.tasks import lr_schedules
from gpipe_tf.data import streaming_inputs
from gpipe_tf import tasks
from gpipe_tf.models import amoebanet
from gpipe_tf.pipeline import PipeliningLayer


class AmoebaNetImageNet(base_experiment.SingleTaskModelParams):
  """AmoebaNet-<CELLS>(NUM_NORMAL_LAYERS, NUM_FILTERS) on ImageNet (not registered)."""

  # Model.
  CELLS = 'D'
  NUM_NORMAL_LAYERS = 18
  NUM_FILTERS = 208
  IMAGE_SIZE = 224
  NUM_CLASSES = 1000
  NUM_STEM_CELLS = 2
  DROPOUT_KEEP_PROB = 0.5
  DROP_PATH_KEEP_PROB = 1.0  # No burn-in schedule here, so off by default.
  BATCH_NORM_DECAY = 0.9997
  # Pipeline.
  NUM_PARTITIONS = 8
  NUM_MICRO_BATCHES = 32
  # Data and training.
  INPUT_GENERATOR = streaming_inputs.TFDSStreamingImageInput
  DATASET_NAME = 'imagenet2012'
  TRAIN_SPLIT = 'train'
  TEST_SPLIT = 'validation'
  DATA_DIR = None  # The TFDS default.
  BATCH_SIZE = 256
  NUM_TRAIN_EXAMPLES = 1281167
  NUM_EPOCHS = 35
  WARMUP_EPOCHS = 3
  LEARNING_RATE_PER_EXAMPLE = 0.0025
  MEAN = (0.5, 0.5, 0.5)  # Pixels scaled to [-1, 1], as Inception does.
  STD = (0.5, 0.5, 0.5)

  def _Input(self, name: str, split: str) -> hyperparams.Params:
    return self.INPUT_GENERATOR.Params().Set(
        name=name, dataset_name=self.DATASET_NAME, split=split,
        data_dir=self.DATA_DIR, download=False, image_size=self.IMAGE_SIZE,
        num_channels=3, mean=self.MEAN, std=self.STD,
        num_classes=self.NUM_CLASSES, batch_size=self.BATCH_SIZE)

  def Train(self) -> hyperparams.Params:
    return self._Input('train', self.TRAIN_SPLIT).Set(
        augment=True, shuffle=True, repeat=True, seed=1)

  def Test(self) -> hyperparams.Params:
    return self._Input('test', self.TEST_SPLIT).Set(
        augment=False, shuffle=False, repeat=False, drop_remainder=False)

  def Layers(self) -> list:
    """The AmoebaNet layer Params the pipeline splits."""
    return amoebanet.AmoebaNet(
        amoebanet.CELLS[self.CELLS], self.NUM_NORMAL_LAYERS, self.NUM_FILTERS,
        self.NUM_CLASSES, self.IMAGE_SIZE, num_stem_cells=self.NUM_STEM_CELLS,
        dropout_keep_prob=self.DROPOUT_KEEP_PROB,
        drop_path_keep_prob=self.DROP_PATH_KEEP_PROB,
        batch_norm_decay=self.BATCH_NORM_DECAY)

  def Task(self) -> hyperparams.Params:
    model = PipeliningLayer.Params().Set(
        name='model', layers=self.Layers(),
        num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES, remat='always',
        input_shapes=[(None, self.IMAGE_SIZE, self.IMAGE_SIZE, 3)])
    p = tasks.ClassificationTask.Params().Set(
        model=model, label_smoothing=0.1, clip_gradient_norm_to_value=10.0,
        random_seed=1)
    p.optimizer = optimizers.RMSProp.Params().Set(decay=0.9, momentum=0.9,
                                                  epsilon=1.0)
    steps_per_epoch = self.NUM_TRAIN_EXAMPLES // self.BATCH_SIZE
    p.learning_rate_schedule = lr_schedules.Cosine.Params().Set(
        learning_rate=self.LEARNING_RATE_PER_EXAMPLE * self.BATCH_SIZE,
        warmup_steps=int(self.WARMUP_EPOCHS * steps_per_epoch),
        total_steps=int(self.NUM_EPOCHS * steps_per_epoch),
        final_learning_rate=0.0)
    return p


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_18_208(AmoebaNetImageNet):  # pylint: disable=invalid-name
  """AmoebaNet-D(18, 208): 82M parameters (Table 1: fits one accelerator)."""
  NUM_FILTERS = 208


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_18_416(AmoebaNetImageNet):  # pylint: disable=invalid-name
  """AmoebaNet-D(18, 416): 318M parameters."""
  NUM_FILTERS = 416


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_18_544(AmoebaNetImageNet):  # pylint: disable=invalid-name
  """AmoebaNet-D(18, 544): 542M parameters."""
  NUM_FILTERS = 544


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_36_544(AmoebaNetImageNet):  # pylint: disable=invalid-name
  """AmoebaNet-D(36, 544): 1.05B parameters."""
  NUM_NORMAL_LAYERS = 36
  NUM_FILTERS = 544


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_72_512(AmoebaNetImageNet):  # pylint: disable=invalid-name
  """AmoebaNet-D(72, 512): 1.8B parameters, Table 1's largest (8 cells)."""
  NUM_NORMAL_LAYERS = 72
  NUM_FILTERS = 512


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512(AmoebaNetImageNet):  # pylint: disable=invalid-name
  """AmoebaNet-B(18, 512) on 480x480 images, 4 cells: 557M parameters."""
  CELLS = 'B'
  NUM_FILTERS = 512
  IMAGE_SIZE = 480
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 16
  BATCH_SIZE = 128


class TransferFromImageNet(AmoebaNetB_18_512):  # pylint: disable=invalid-name
  """AmoebaNet-B(18, 512) fine-tuned from ImageNet on DATASET_NAME (not registered).

  Changes from the ImageNet run: the data (DATASET_NAME, splits, class
  count; images of any size cropped and resized to 480x480), the task's
  init_from_checkpoint (INIT_FROM_CHECKPOINT: the ImageNet run's logdir, its
  ckpt/ directory or a ckpt-N prefix; set it, e.g. with
  ``--model_params_override="init_from_checkpoint : '/runs/imagenet'"``),
  the softmax layer left out of the warm start (INIT_FROM_CHECKPOINT_SKIP),
  and the optimisation. The optimisation defaults are not the paper's
  (this library does not reproduce its per-dataset fine-tuning settings):
  they are the common fine-tuning recipe of Kornblith et al. 2019 ("Do
  Better ImageNet Models Transfer Better?": SGD with momentum 0.9, batch
  256, 20,000 steps, warm-up then cosine decay), and LEARNING_RATE is meant
  to be tuned on a held-out part of the training split.
  Without INIT_FROM_CHECKPOINT the run trains from scratch.
  """

  INIT_FROM_CHECKPOINT = None
  INIT_FROM_CHECKPOINT_SKIP = (r'^task/model/head/logits/',)
  DATASET_NAME = None  # Set by each dataset's experiment.
  TRAIN_SPLIT = 'train'
  TEST_SPLIT = 'test'
  NUM_CLASSES = None
  BATCH_SIZE = 256
  NUM_MICRO_BATCHES = 32
  LEARNING_RATE = 0.01
  MOMENTUM = 0.9
  WARMUP_STEPS = 500
  TRAIN_STEPS = 20000

  def Task(self) -> hyperparams.Params:
    p = super().Task()
    p.optimizer = optimizers.SGD.Params().Set(momentum=self.MOMENTUM)
    p.learning_rate_schedule = lr_schedules.Cosine.Params().Set(
        learning_rate=self.LEARNING_RATE, warmup_steps=self.WARMUP_STEPS,
        total_steps=self.TRAIN_STEPS, final_learning_rate=0.0)
    p.init_from_checkpoint = self.INIT_FROM_CHECKPOINT
    p.init_from_checkpoint_skip = list(self.INIT_FROM_CHECKPOINT_SKIP)
    return p
