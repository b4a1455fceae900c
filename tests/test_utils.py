"""Shared test set-up (logical CPU devices as accelerators) and readers of inputs, checkpoints, summaries."""

import collections
import os
import shutil
import tempfile
import threading

# Before TensorFlow loads: its oneDNN rewrites, on by default on CPUs with
# AVX512-VNNI, rename the ops the engine's tests count (MatMul runs as
# _MklMatMul, an activation fused into it) and change sums in the last bits,
# so the same test passed on one CI machine and failed on the next. The suite
# runs TensorFlow's own kernels on every CPU (docs/testing.md); set the
# variable to 1 to test with oneDNN.
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')

from absl import flags  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import base_layer
from gpipe_tf.runtime import devices

# The repository root: the working directory of trainer subprocesses.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A child script's PYTHONPATH: the repository and tests/ (entry_point.py).
CHILD_PYTHONPATH = os.pathsep.join(
    [REPO_ROOT, os.path.dirname(os.path.abspath(__file__))])

# Every test process splits the CPU into this many logical devices, once,
# before any op runs (conftest.py under pytest; module import otherwise).
NUM_TEST_DEVICES = 4


def WriteVariableSizeImages(root, num_train=37, num_classes=3, num_test=9,
                            seed=0):
  """root/<split>/c<k>/<i>.(jpg|png): RGB and grey images of mixed sizes,
  example i in class i % num_classes (an image folder of any-size images)."""
  rng = np.random.default_rng(seed)
  for split, count in (('train', num_train), ('test', num_test)):
    for i in range(count):
      folder = os.path.join(root, split, f'c{i % num_classes}')
      os.makedirs(folder, exist_ok=True)
      height, width = rng.integers(6, 40, size=2)
      image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
      if i % 2:
        data = tf.io.encode_jpeg(image, quality=95)
        path = os.path.join(folder, f'{i}.jpg')
      else:
        data = tf.io.encode_png(image[..., :1] if i % 4 == 0 else image)
        path = os.path.join(folder, f'{i}.png')
      tf.io.write_file(path, data)


def FcParams(i, din, dout, act='TANH'):
  """Params of FCLayer 'fc<i>' (din -> dout) for the transparency tests."""
  from gpipe_tf.layers import core  # pylint: disable=g-import-not-at-top
  return core.FCLayer.Params().Set(name=f'fc{i}', input_dim=din,
                                   output_dim=dout, activation=act)


def MlpLayers():
  """8 FC layers 6 -> ... -> 5 with every activation: the transparency MLP."""
  dims = [6, 12, 12, 10, 12, 12, 8, 8, 5]
  acts = ['TANH', 'RELU', 'SIGMOID', 'GELU', 'TANH', 'RELU', 'TANH', 'NONE']
  return [FcParams(i, dims[i], dims[i + 1], acts[i]) for i in range(len(acts))]


# The variable TiedScale layers track (set it before building them).
SHARED = {}


class TiedScale(base_layer.BaseLayer):
  """x * SHARED['v']: a variable this layer TRACKS (an attribute), as a tied
  embedding and softmax, or an ALBERT block, do; several layers track one."""

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    self.shared = SHARED['v']

  def FProp(self, x, training=False):
    return x * self.shared

  @classmethod
  def FPropMeta(cls, p, shape):
    return base_layer.LayerMeta(1, (shape,), 0)


class NoNaN(base_layer.BaseLayer):
  """Passes its input on; check_numerics fails as the step runs on a NaN
  in it (an op that fails only for the micro-batch that holds the NaN)."""

  def FProp(self, x, training=False):
    return tf.debugging.check_numerics(x, 'a NaN')

  @classmethod
  def FPropMeta(cls, p, shape):
    return base_layer.LayerMeta(0, (tuple(shape),), 0)


def MarkFlagsParsed() -> None:
  """Lets code that reads absl flags run under pytest, which parses none:
  they count as parsed, at their defaults (flagsaver sets some for a test)."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


class FlagsParsedTestCase(tf.test.TestCase):
  """A TestCase for code that reads absl flags (pytest parses none: they
  count as parsed) with a temporary directory `root` for the class."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    MarkFlagsParsed()
    cls.root = tempfile.mkdtemp()

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()


def LogSoftmax(x):
  """NumPy log-softmax over the last axis in float64: the reference the task
  loss tests compare against."""
  x = np.asarray(x, np.float64)
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def SetUpDevices() -> list:
  return devices.SplitCpu(NUM_TEST_DEVICES)


def Batches(generator, num, skip=0):
  """The first `num` batches of GetDataset(skip) as dicts of numpy arrays."""
  return list(generator.GetDataset(skip_batches=skip).take(num)
              .as_numpy_iterator())


def FreePorts(n):
  """n distinct free localhost ports (local_workers.FreePorts)."""
  from gpipe_tf.runtime import local_workers  # pylint: disable=g-import-not-at-top
  return local_workers.FreePorts(n)


def RaisesWithin(seconds, fn):
  """Runs fn in a daemon thread; returns its exception, fails on a hang."""
  outcome = {}

  def _Run():
    try:
      fn()
    except Exception as e:  # pylint: disable=broad-except
      outcome['error'] = e

  thread = threading.Thread(target=_Run, daemon=True)
  thread.start()
  thread.join(seconds)
  if thread.is_alive():
    raise AssertionError(f'Call did not return within {seconds} s.')
  return outcome.get('error')


def CheckpointValues(logdir, step=None, skip=('save_counter',)):
  """{key: value} of logdir/ckpt/ckpt-<step> (None: the newest checkpoint).

  Leaves out the object graph and the keys starting with a prefix in `skip`.
  """
  directory = os.path.join(logdir, 'ckpt')
  path = (tf.train.latest_checkpoint(directory) if step is None
          else os.path.join(directory, f'ckpt-{step}'))
  reader = tf.train.load_checkpoint(path)
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if not k.startswith(('_CHECKPOINTABLE',) + tuple(skip))}


def Scalars(directory):
  """{tag: {step: value}} of all scalar summaries in `directory`."""
  out = collections.defaultdict(dict)
  pattern = os.path.join(directory, 'events.out.tfevents.*')
  for path in tf.io.gfile.glob(pattern):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        out[value.tag][event.step] = float(tf.make_ndarray(value.tensor))
  return out


def AssertPipelineEqualsKeras(test, model, x, targets, runs, micro_batches=2):
  """Converts a Keras model, checks one training step at each (K, schedule)
  of `runs` against Keras's own step over the same micro-batches (loss and
  every gradient), and the converted layers' inference against the model's;
  returns the converted Params."""
  from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
  from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
  from tools.keras_zoo import main as keras_zoo  # pylint: disable=g-import-not-at-top
  params = pipeline.FromKeras(model)
  want_loss, want = keras_zoo.KerasStep(model, x, targets, micro_batches)
  for k, schedule in runs:
    with test.subTest(k=k, schedule=schedule):
      _, loss, got = keras_zoo.PipelineStep(
          model, params, x, targets, micro_batches, num_partitions=k,
          schedule=schedule)
      test.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
      for var, g, h in zip(model.trainable_variables, want, got):
        test.assertAllClose(g, h, rtol=1e-5, atol=1e-6, msg=var.path)
  seq = layers.SequentialLayer.Params().Set(name='net',
                                            layers=params).Instantiate()
  pipeline.LoadKerasWeights(seq, model)
  test.assertAllClose(model(x, training=False), seq.FProp(x), rtol=1e-5,
                      atol=1e-6)
  return params


_ROUTED = []


def _Routed():
  """A Keras layer, tanh(x w), that in training adds a router-like loss
  with add_loss: its coefficient times the squared batch mean of its outputs
  (nonlinear in the batch, as a MoE router's load-balancing loss is)."""
  if _ROUTED:
    return _ROUTED[0]
  import keras  # pylint: disable=g-import-not-at-top

  @keras.saving.register_keras_serializable(package='gpipe_test_aux')
  class Routed(keras.layers.Layer):

    def __init__(self, units, coefficient, **kwargs):
      super().__init__(**kwargs)
      self.units = units
      self.coefficient = coefficient

    def build(self, input_shape):
      self.w = self.add_weight(name='w', shape=(input_shape[-1], self.units),
                               initializer='glorot_uniform')

    def call(self, x, training=None):
      y = keras.ops.tanh(keras.ops.matmul(x, self.w))
      if training:
        self.add_loss(self.coefficient * keras.ops.sum(
            keras.ops.square(keras.ops.mean(y, axis=0))))
      return y

    def get_config(self):
      return dict(super().get_config(), units=self.units,
                  coefficient=self.coefficient)

  _ROUTED.append(Routed)
  return Routed


def KerasAuxLossModel():
  """A Keras model of 4 layers (6 features in, 3 out) whose two Routed
  layers add losses in training, one in each cell at K=2; compiled with
  loss 'mse'."""
  import keras  # pylint: disable=g-import-not-at-top
  routed = _Routed()
  keras.utils.set_random_seed(3)
  x = inputs = keras.Input((6,))
  x = routed(8, 0.7, name='router0')(x)
  x = keras.layers.Dense(8, activation='tanh', name='fc0')(x)
  x = routed(8, 1.3, name='router1')(x)
  model = keras.Model(inputs, keras.layers.Dense(3, name='logits')(x))
  model.compile(loss='mse')
  return model
