"""AmoebaNet-B(18, 512) fine-tuned from ImageNet on Food-101 (GPipe Table 4: 93.0% test accuracy).

``image.food101.AmoebaNetB_18_512`` is ``imagenet.TransferFromImageNet`` on
TFDS 'food101' (75,750 train / 25,250 test photos of up to 512 pixels a
side, 101 dishes; TFDS calls the test split 'validation'), streamed and
cropped and resized to 480x480.
"""

from __future__ import annotations

from gpipe_tf import model_registry
from params.image import imagenet


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512(imagenet.TransferFromImageNet):  # pylint: disable=invalid-name
  """AmoebaNet-B(18, 512), ImageNet-initialised, on Food-101 at 480x480."""
  DATASET_NAME = 'food101'
  TEST_SPLIT = 'validation'
  NUM_CLASSES = 101
  NUM_TRAIN_EXAMPLES = 75750
