"""AmoebaNet-B(18, 512) fine-tuned from ImageNet on Birdsnap (GPipe Table 4: 83.6% test accuracy).

``image.birdsnap.AmoebaNetB_18_512`` is ``imagenet.TransferFromImageNet`` on
a dataset named 'birdsnap': 500 North American bird species; the paper's
split has 47,386 train / 2,443 test images. TFDS 4.9 has no builder for it,
and the release (Berg et al. 2014) is a list of image URLs, many of them no
longer reachable, so the images a user gathers will differ in number from
the paper's. Arrange them as birdsnap/<split>/<species>/<image>.jpg (test:
the images listed in the release's test_images.txt) and write them once,
offline::

  from gpipe_tf.data import datasets
  datasets.PrepareImageFolder('birdsnap', 'birdsnap', DATA_DIR)

NUM_CLASSES is checked against the written dataset, so a download missing a
whole species fails at once instead of training with shifted class ids.
"""

from __future__ import annotations

from gpipe_tf import model_registry
from params.image import imagenet


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512(imagenet.TransferFromImageNet):  # pylint: disable=invalid-name
  """AmoebaNet-B(18, 512), ImageNet-initialised, on Birdsnap at 480x480."""
  DATASET_NAME = 'birdsnap'
  NUM_CLASSES = 500
  NUM_TRAIN_EXAMPLES = 47386
