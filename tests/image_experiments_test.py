"""Every registered image experiment builds its Params and takes one pipelined training step."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import os  # pylint: disable=g-import-not-at-top
import tempfile

import numpy as np
import tensorflow as tf

from gpipe_tf import model_registry
from gpipe_tf import optimizers
from gpipe_tf.models import amoebanet
from gpipe_tf.pipeline import PipeliningLayer
from params.image import digits

_IMAGENET = ('AmoebaNetD_18_208', 'AmoebaNetD_18_416', 'AmoebaNetD_18_544',
             'AmoebaNetD_36_544', 'AmoebaNetD_72_512', 'AmoebaNetB_18_512')
_NAMES = ['image.digits.AmoebaNetTiny'] + [
    f'image.imagenet.{n}' for n in _IMAGENET]

# What a test subclass changes: a 3-cell AmoebaNet on 8x8 images, 2 cells of
# pipeline, 2 micro-batches (the structure and the wiring stay the same).
_SMALL = dict(NUM_NORMAL_LAYERS=1, NUM_FILTERS=4, NUM_STEM_CELLS=0,
              STEM_FILTERS=8, IMAGE_SIZE=8, NUM_PARTITIONS=2,
              NUM_MICRO_BATCHES=2, BATCH_SIZE=4)


def _Registered() -> list[str]:
  return [n for n in model_registry.ListModels() if n.startswith('image.')]


def _Shrunk(cls: type) -> type:
  return type('Small' + cls.__name__, (cls,), dict(_SMALL))


class RegistryTest(tf.test.TestCase):

  def testImageExperimentsAreRegistered(self):
    self.assertContainsSubset(_NAMES, _Registered())


class FullSizeParamsTest(tf.test.TestCase):

  def testImageNetExperiments(self):
    for name in _IMAGENET:
      with self.subTest(name=name):
        p = model_registry.GetParams('image.imagenet.' + name)
        model = p.task.model
        self.assertIs(model.cls, PipeliningLayer)
        self.assertEqual(model.remat, 'always')
        self.assertGreaterEqual(model.num_micro_batches,
                                4 * model.num_partitions)
        size = 480 if name == 'AmoebaNetB_18_512' else 224
        self.assertEqual(model.num_partitions, 4 if size == 480 else 8)
        self.assertEqual(list(model.input_shapes), [(None, size, size, 3)])
        self.assertIs(p.task.optimizer.cls, optimizers.RMSProp)
        self.assertEqual(p.task.label_smoothing, 0.1)
        self.assertEqual((p.train.dataset_name, p.train.split),
                         ('imagenet2012', 'train'))
        self.assertEqual((p.train.augment, p.test.augment), (True, False))
        self.assertEqual((p.train.image_size, p.test.image_size),
                         (size, size))
        self.assertFalse(p.train.download or p.test.download)
        self.assertEqual(model.layers[-1].num_classes, 1000)
        # The name says the model: L normal cells of D filters.
        layers, filters = map(int, name.split('_')[1:])
        cells = [l for l in model.layers if l.name.startswith('cell_')]
        self.assertLen(cells, layers)
        self.assertEqual(cells[0].num_filters, filters)

  def testDigitsExperiment(self):
    p = model_registry.GetParams('image.digits.AmoebaNetTiny')
    self.assertIs(p.task.model.cls, PipeliningLayer)
    self.assertEqual(p.task.model.num_partitions, 2)
    self.assertEqual((p.train.dataset_name, p.train.num_channels),
                     ('digits', 1))
    self.assertLess(amoebanet.NumParams(p.task.model.layers,
                                        p.task.model.input_shapes[0]), 1e6)


class OneTrainingStepTest(tf.test.TestCase):

  def testEveryExperimentTrainsOneStep(self):
    for name in _Registered():
      with self.subTest(name=name):
        p = _Shrunk(model_registry.GetClass(name))().ExperimentParams()
        shape = p.task.model.input_shapes[0]
        num_classes = p.task.model.layers[-1].num_classes
        batch = {
            'inputs': tf.random.stateless_normal((4,) + tuple(shape[1:]),
                                                 [1, 2]),
            'labels': tf.constant([0, 1, 2, num_classes - 1], tf.int32),
        }
        task = p.task.Instantiate()
        self.assertLen(task.model.balance, 2)
        optimizer = task.CreateOptimizer()
        variables = task.trainable_variables
        before = [v.numpy() for v in variables]
        with tf.GradientTape() as tape:
          loss, metrics = task.ComputeLoss(batch, training=True)
        grads = tape.gradient(loss, variables)
        self.assertEqual([v.name for v, g in zip(variables, grads)
                          if g is None], [])
        optimizer.apply_gradients(zip(grads, variables))
        self.assertTrue(np.isfinite(loss.numpy()))
        self.assertIn('accuracy', metrics)
        self.assertEqual(int(optimizer.iterations), 1)
        # (Warm-up makes the first RMSProp step tiny: some weights keep
        # their float32 value, so only 'some moved' is asserted.)
        self.assertTrue(any(np.any(b != v.numpy())
                            for b, v in zip(before, variables)))


class DigitsInputTest(tf.test.TestCase):

  def testWritesTheDatasetOnFirstUse(self):
    data_dir = os.path.join(tempfile.mkdtemp(dir=self.get_temp_dir()), 'd')
    p = digits.AmoebaNetTiny().Train().Set(data_dir=data_dir, batch_size=8)
    generator = p.Instantiate()
    self.assertFalse(os.path.exists(data_dir))  # Nothing written yet.
    self.assertEqual(generator.NumExamples(), 1437)
    batch = next(iter(generator.GetDataset()))
    self.assertEqual(batch['inputs'].shape.as_list(), [8, 16, 16, 1])
    self.assertAllInRange(batch['labels'], 0, 9)


if __name__ == '__main__':
  tf.test.main()
