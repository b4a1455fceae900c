"""AmoebaNet-B(18, 512) fine-tuned from ImageNet on CIFAR-10 (GPipe Table 4: 99.0% test accuracy), images upscaled to 480x480.

``image.cifar10.AmoebaNetB_18_512`` is ``imagenet.TransferFromImageNet`` on
TFDS 'cifar10' (50,000 train / 10,000 test images of 32x32, 10 classes).
CIFAR fits in host memory (150 MB), so it is read by the in-memory
``inputs.TFDSImageInput``, which upscales every batch to 480x480 (training:
a random square crop of 75% to 100% of the side, and a flip; test: the whole
image). Set INIT_FROM_CHECKPOINT (or override the task's
init_from_checkpoint) to the ImageNet run.
"""

from __future__ import annotations

from gpipe_tf import hyperparams
from gpipe_tf.data import inputs
from gpipe_tf import model_registry
from params.image import imagenet


class CifarTransfer(imagenet.TransferFromImageNet):
  """TransferFromImageNet on a 32x32 CIFAR set held in memory (not registered)."""

  INPUT_GENERATOR = inputs.TFDSImageInput  # 32x32 images fit in memory.
  TEST_SPLIT = 'test'
  CROP_MIN_FRACTION = 0.75

  def Train(self) -> hyperparams.Params:
    return self._Input('train', self.TRAIN_SPLIT).Set(
        augment=True, crop_min_fraction=self.CROP_MIN_FRACTION, shuffle=True,
        repeat=True, seed=1)


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512(CifarTransfer):  # pylint: disable=invalid-name
  """AmoebaNet-B(18, 512), ImageNet-initialised, on CIFAR-10 at 480x480."""
  DATASET_NAME = 'cifar10'
  NUM_CLASSES = 10
  NUM_TRAIN_EXAMPLES = 50000
