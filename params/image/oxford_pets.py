"""AmoebaNet-B(18, 512) fine-tuned from ImageNet on Oxford-IIIT Pets (GPipe Table 4: 95.9% test accuracy).

``image.oxford_pets.AmoebaNetB_18_512`` is ``imagenet.TransferFromImageNet``
on TFDS 'oxford_iiit_pet' (3,680 train / 3,669 test photos of varying sizes,
37 breeds; the segmentation masks are not read), streamed and cropped and
resized to 480x480.
"""

from __future__ import annotations

from gpipe_tf import model_registry
from params.image import imagenet


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512(imagenet.TransferFromImageNet):  # pylint: disable=invalid-name
  """AmoebaNet-B(18, 512), ImageNet-initialised, on Oxford Pets at 480x480."""
  DATASET_NAME = 'oxford_iiit_pet'
  NUM_CLASSES = 37
  NUM_TRAIN_EXAMPLES = 3680
