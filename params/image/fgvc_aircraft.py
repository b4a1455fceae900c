"""AmoebaNet-B(18, 512) fine-tuned from ImageNet on FGVC Aircraft (GPipe Table 4: 92.7% test accuracy).

``image.fgvc_aircraft.AmoebaNetB_18_512`` is ``imagenet.TransferFromImageNet``
on a dataset named 'fgvc_aircraft': 6,667 trainval / 3,333 test photos, 100
aircraft variants. TFDS 4.9 has no builder for it, so it cannot be
downloaded through TFDS: bring the images of the official release (Maji et
al. 2013) and write them once, offline, as a TFDS dataset::

  # aircraft/train/<variant>/<image>.jpg  (from images_variant_trainval.txt)
  # aircraft/test/<variant>/<image>.jpg   (from images_variant_test.txt)
  from gpipe_tf.data import datasets
  datasets.PrepareImageFolder('aircraft', 'fgvc_aircraft', DATA_DIR)

(variant folder names must not contain '/'; e.g. 'F-16A/B' -> 'F-16A_B').
The images are then streamed and cropped and resized to 480x480 like the
other sets.
"""

from __future__ import annotations

from gpipe_tf import model_registry
from params.image import imagenet


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512(imagenet.TransferFromImageNet):  # pylint: disable=invalid-name
  """AmoebaNet-B(18, 512), ImageNet-initialised, on FGVC Aircraft at 480x480."""
  DATASET_NAME = 'fgvc_aircraft'
  NUM_CLASSES = 100
  NUM_TRAIN_EXAMPLES = 6667
