"""AmoebaNet-B(18, 512) fine-tuned from ImageNet on Stanford Cars (GPipe Table 4: 94.6% test accuracy).

``image.stanford_cars.AmoebaNetB_18_512`` is ``imagenet.TransferFromImageNet``
on TFDS 'cars196' (8,144 train / 8,041 test photos of varying sizes, 196
classes), streamed from its files and cropped and resized to 480x480. TFDS
downloads it with download=True on a machine with network access; copy the
prepared 'cars196/<version>' folder into DATA_DIR for offline use.
"""

from __future__ import annotations

from gpipe_tf import model_registry
from params.image import imagenet


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512(imagenet.TransferFromImageNet):  # pylint: disable=invalid-name
  """AmoebaNet-B(18, 512), ImageNet-initialised, on Stanford Cars at 480x480."""
  DATASET_NAME = 'cars196'
  NUM_CLASSES = 196
  NUM_TRAIN_EXAMPLES = 8144
