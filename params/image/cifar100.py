"""AmoebaNet-B(18, 512) fine-tuned from ImageNet on CIFAR-100 (GPipe Table 4: 91.3% test accuracy), images upscaled to 480x480.

``image.cifar100.AmoebaNetB_18_512`` is the CIFAR-10 experiment's set-up
(``cifar10.CifarTransfer``: in-memory input, upscaling to 480x480) on TFDS
'cifar100' (50,000 train / 10,000 test, the 100 fine labels).
"""

from __future__ import annotations

from gpipe_tf import model_registry
from params.image import cifar10


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512(cifar10.CifarTransfer):  # pylint: disable=invalid-name
  """AmoebaNet-B(18, 512), ImageNet-initialised, on CIFAR-100 at 480x480."""
  DATASET_NAME = 'cifar100'
  NUM_CLASSES = 100
  NUM_TRAIN_EXAMPLES = 50000
