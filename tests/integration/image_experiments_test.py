"""Every registered image experiment builds its Params and takes one pipelined training step."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import os  # pylint: disable=g-import-not-at-top
import tempfile

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from gpipe_tf.data import datasets
from gpipe_tf.data import inputs
from gpipe_tf import model_registry
from gpipe_tf.tasks import optimizers
from gpipe_tf.data import streaming_inputs
from gpipe_tf.train import warm_start
from gpipe_tf.models import amoebanet
from gpipe_tf.pipeline import PipeliningLayer
from params.image import digits
from params.image import imagenet

_IMAGENET = ('AmoebaNetD_18_208', 'AmoebaNetD_18_416', 'AmoebaNetD_18_544',
             'AmoebaNetD_36_544', 'AmoebaNetD_72_512', 'AmoebaNetB_18_512')
# Table 4: module -> (TFDS name, test split, classes, reader).
_STREAMED = streaming_inputs.TFDSStreamingImageInput
_TRANSFER = {
    'cifar10': ('cifar10', 'test', 10, inputs.TFDSImageInput),
    'cifar100': ('cifar100', 'test', 100, inputs.TFDSImageInput),
    'stanford_cars': ('cars196', 'test', 196, _STREAMED),
    'oxford_pets': ('oxford_iiit_pet', 'test', 37, _STREAMED),
    'food101': ('food101', 'validation', 101, _STREAMED),
    'fgvc_aircraft': ('fgvc_aircraft', 'test', 100, _STREAMED),
    'birdsnap': ('birdsnap', 'test', 500, _STREAMED),
}
_DIGITS = ('AmoebaNetTiny', 'AmoebaNetTinyDigits0To5',
           'AmoebaNetTinyDigits6To9', 'AmoebaNetTinyDigits6To9FineTune')
_NAMES = ([f'image.digits.{n}' for n in _DIGITS] +
          [f'image.imagenet.{n}' for n in _IMAGENET] +
          [f'image.{m}.AmoebaNetB_18_512' for m in _TRANSFER])
_HEAD = ['task/model/head/logits/b', 'task/model/head/logits/w']

# What a test subclass changes: a 3-cell AmoebaNet on 8x8 images, 2 cells of
# pipeline, 2 micro-batches (the structure and the wiring stay the same).
_SMALL = dict(NUM_NORMAL_LAYERS=1, NUM_FILTERS=4, NUM_STEM_CELLS=0,
              STEM_FILTERS=8, IMAGE_SIZE=8, NUM_PARTITIONS=2,
              NUM_MICRO_BATCHES=2, BATCH_SIZE=4)


def _Registered() -> list[str]:
  return [n for n in model_registry.ListModels() if n.startswith('image.')]


def _Shrunk(cls: type, **changes) -> type:
  return type('Small' + cls.__name__, (cls,), dict(_SMALL, **changes))


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
        self.assertEqual(p.test.split, 'validation')
        self.assertIs(p.train.cls, _STREAMED)
        self.assertIsNone(p.task.init_from_checkpoint)
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

  def testTransferExperiments(self):
    for module, (dataset, test_split, classes, reader) in _TRANSFER.items():
      with self.subTest(module=module):
        p = model_registry.GetParams(f'image.{module}.AmoebaNetB_18_512')
        model = p.task.model
        self.assertIs(model.cls, PipeliningLayer)
        self.assertEqual(model.num_partitions, 4)
        self.assertEqual(list(model.input_shapes), [(None, 480, 480, 3)])
        cells = [l for l in model.layers if l.name.startswith('cell_')]
        self.assertLen(cells, 18)
        self.assertEqual(cells[0].num_filters, 512)
        self.assertEqual(cells[0].operations,
                         amoebanet.CELLS['B'][0].operations)
        self.assertEqual(model.layers[-1].num_classes, classes)
        for inp, split in ((p.train, 'train'), (p.test, test_split)):
          self.assertIs(inp.cls, reader)
          self.assertEqual((inp.dataset_name, inp.split, inp.image_size,
                            inp.num_classes), (dataset, split, 480, classes))
          self.assertFalse(inp.download)
        self.assertEqual((p.train.augment, p.test.augment), (True, False))
        self.assertEqual((p.train.repeat, p.test.repeat), (True, False))
        self.assertIs(p.task.optimizer.cls, optimizers.SGD)
        self.assertEqual(p.task.optimizer.momentum, 0.9)
        self.assertEqual(p.task.learning_rate_schedule.total_steps, 20000)
        self.assertIsNone(p.task.init_from_checkpoint)  # The user sets it.
        self.assertEqual(p.task.init_from_checkpoint_skip,
                         [r'^task/model/head/logits/'])
        # Subclassing ImageNet's: everything but the data and the recipe is
        # the ImageNet run's.
        base = model_registry.GetParams('image.imagenet.AmoebaNetB_18_512')
        self.assertEqual(model.layers[:-1], base.task.model.layers[:-1])

  def testDigitsExperiment(self):
    p = model_registry.GetParams('image.digits.AmoebaNetTiny')
    self.assertIs(p.task.model.cls, PipeliningLayer)
    self.assertEqual(p.task.model.num_partitions, 2)
    self.assertEqual((p.train.dataset_name, p.train.num_channels),
                     ('digits', 1))
    self.assertLess(amoebanet.NumParams(p.task.model.layers,
                                        p.task.model.input_shapes[0]), 1e6)


class OneTrainingStepTest(tf.test.TestCase):

  def testEachKindOfExperimentTrainsOneStep(self):
    # Shrunk, the experiments of a family build the same structure; one
    # AmoebaNet-D (digits, the quick start's) and one AmoebaNet-B with a
    # transfer head (CIFAR-10) train here. Each eager step traces its cells'
    # programs (the suite's costliest kind of step); the ImageNet
    # experiments share these cells and the optimizer, and
    # FullSizeParamsTest checks their Params, testImageExperimentsAreRegistered
    # every name. One micro-batch (half the cell programs to run): the
    # claim is that the experiment's Params train, and
    # amoebanet_test.testPipelinedEqualsSequentialOnEachMicroBatch pipelines
    # AmoebaNet over two micro-batches.
    kinds = ['image.digits.AmoebaNetTiny', 'image.cifar10.AmoebaNetB_18_512']
    self.assertContainsSubset(kinds, _Registered())
    for name in kinds:
      with self.subTest(name=name):
        p = _Shrunk(model_registry.GetClass(name),
                    NUM_MICRO_BATCHES=1)().ExperimentParams()
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


class TransferTest(tf.test.TestCase):
  """The Table 4 experiments read their data and start from ImageNet's."""

  def testWarmStartFromTheImageNetExperiment(self):
    source = _Shrunk(imagenet.AmoebaNetB_18_512)().Task().Instantiate()
    prefix = tf.train.Checkpoint(task=source).write(
        os.path.join(self.get_temp_dir(), 'imagenet'))
    for module in ('stanford_cars', 'cifar100'):
      with self.subTest(module=module):
        experiment = _Shrunk(model_registry.GetClass(
            f'image.{module}.AmoebaNetB_18_512'))()
        task = experiment.Task().Instantiate()
        result = warm_start.InitFromCheckpoint(
            task, prefix, experiment.Task().init_from_checkpoint_skip)
        self.assertCountEqual(result.skipped, _HEAD)  # Only the softmax.
        self.assertLen(result.loaded, len(task.variables) - 2)
        values = {v.name[:-2]: v for v in task.variables}
        self.assertEqual(values[_HEAD[1]].shape[-1], _TRANSFER[module][2])
        source_values = {v.name[:-2]: v for v in source.variables}
        for name, value in values.items():
          if name not in _HEAD:
            self.assertAllEqual(value, source_values[name])

  def testStreamedSetsReadImagesOfAnySize(self):
    root = tempfile.mkdtemp(dir=self.get_temp_dir())
    test_utils.WriteVariableSizeImages(os.path.join(root, 'f'))
    datasets.PrepareImageFolder(os.path.join(root, 'f'), 'anysize',
                                os.path.join(root, 'tfds'))
    streamed = [m for m, (_, _, _, reader) in _TRANSFER.items()
                if reader is _STREAMED]
    self.assertLen(streamed, 5)
    for module in streamed:
      # Each streamed experiment is ImageNet's transfer experiment with
      # other constants and no method of its own (the dataset's constants
      # are set below): the inputs of one read as every one's do (one
      # module reads its 480x480 images, not five);
      # FullSizeParamsTest.testTransferExperiments checks each one's Params.
      cls = model_registry.GetClass(f'image.{module}.AmoebaNetB_18_512')
      self.assertTrue(issubclass(cls, imagenet.TransferFromImageNet))
      self.assertEqual([k for k, v in vars(cls).items() if callable(v)], [],
                       module)
    experiment = _Shrunk(model_registry.GetClass(
        'image.stanford_cars.AmoebaNetB_18_512'), IMAGE_SIZE=480,
                         DATASET_NAME='anysize', TEST_SPLIT='test',
                         DATA_DIR=os.path.join(root, 'tfds'), NUM_CLASSES=3)()
    for p in (experiment.Train(), experiment.Test()):
      batch = next(iter(p.Instantiate().GetDataset()))
      self.assertEqual(batch['inputs'].shape.as_list(), [4, 480, 480, 3])
      self.assertAllInRange(batch['labels'], 0, 2)

  def testCifarIsUpscaledTo480(self):
    for module in ('cifar10', 'cifar100'):
      with self.subTest(module=module):
        experiment = _Shrunk(model_registry.GetClass(
            f'image.{module}.AmoebaNetB_18_512'), IMAGE_SIZE=480,
                             BATCH_SIZE=2)()
        with tfds.testing.mock_data(num_examples=4):
          for p in (experiment.Train(), experiment.Test()):
            batch = next(iter(p.Instantiate().GetDataset()))
            self.assertEqual(batch['inputs'].shape.as_list(),
                             [2, 480, 480, 3])


class DigitsTransferDemoTest(tf.test.TestCase):
  """The demo's wiring: 6-class pre-training, then 4-class fine-tuning."""

  def testDataAndWarmStart(self):
    data_dir = os.path.join(tempfile.mkdtemp(dir=self.get_temp_dir()), 'd')
    small = dict(DATA_DIR=data_dir, BATCH_SIZE=256)
    pretrain = _Shrunk(digits.AmoebaNetTinyDigits0To5, **small)()
    finetune = _Shrunk(digits.AmoebaNetTinyDigits6To9FineTune, **small)()
    for p, classes in ((pretrain.Train(), 6), (finetune.Train(), 4),
                       (finetune.Test(), 4)):
      labels = next(iter(p.Instantiate().GetDataset()))['labels']
      self.assertEqual(set(labels.numpy()), set(range(classes)))
    # Digits 6-9 of the first quarter (359) of the 1,437 training images.
    self.assertBetween(finetune.Train().Instantiate().NumExamples(), 100, 200)
    source = pretrain.Task().Instantiate()
    prefix = tf.train.Checkpoint(task=source).write(
        os.path.join(self.get_temp_dir(), 'd05'))
    task = finetune.Task().Instantiate()
    result = warm_start.InitFromCheckpoint(
        task, prefix, finetune.Task().init_from_checkpoint_skip)
    self.assertCountEqual(result.skipped, _HEAD)
    self.assertLen(result.loaded, len(task.variables) - 2)


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
