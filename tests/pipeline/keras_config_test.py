"""keras_config and the arguments Params cannot hold as text: layers whose own config does not round-trip are rebuilt another way, a Lambda runs by its function's name or is refused by FromKeras, array constants are held as numbers."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import keras  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import errors  # pylint: disable=g-import-not-at-top
from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import keras_errors  # pylint: disable=g-import-not-at-top
from tools.keras_zoo import main as keras_zoo  # pylint: disable=g-import-not-at-top


class ExtraKeys(keras.layers.Layer):
  """get_config() writes a derived value its constructor refuses (as
  keras_hub's ViTPatchingAndEmbedding writes num_patches)."""

  def __init__(self, units, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.dense = keras.layers.Dense(units)

  def call(self, x):
    return self.dense(x)

  def get_config(self):
    return dict(super().get_config(), units=self.units,
                derived=2 * self.units)


class BrokenConfig(keras.layers.Layer):
  """get_config() reads an attribute __init__ never set, and the layer is
  made with a function and an initialiser object (so Keras records no
  constructor arguments): keras_hub's LlamaTransformerDecoder."""

  def __init__(self, units, activation='relu', kernel_initializer='zeros',
               scale=1.0, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.activation = keras.activations.get(activation)
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self.scale = scale

  def build(self, shape):
    self.dense = keras.layers.Dense(
        self.units, kernel_initializer=self.kernel_initializer)
    self.dense.build(shape)

  def call(self, x):
    return self.activation(self.dense(x)) * self.scale

  def get_config(self):
    return dict(super().get_config(), units=self.units,
                scale_factor=self.scale_factor)  # pylint: disable=no-member


class HiddenScale(BrokenConfig):
  """BrokenConfig whose scale lives under another attribute name, so that
  reading the attributes would rebuild it with scale 1.0."""

  def __init__(self, units, activation, scale=1.0, **kwargs):
    super().__init__(units, activation=activation, **kwargs)
    del self.scale
    self.hidden = scale

  def call(self, x):
    return self.activation(self.dense(x)) * self.hidden


class TrackedSizes(keras.layers.Layer):
  """get_config() returns a list attribute, which Keras tracks (a
  TrackedList holding the layer): keras_hub's QwenSparseMoeBlock."""

  def __init__(self, sizes, **kwargs):
    super().__init__(**kwargs)
    self.sizes = list(sizes)

  def call(self, x):
    return x * float(sum(self.sizes))

  def get_config(self):
    return dict(super().get_config(), sizes=self.sizes)


class EagerScale(keras.layers.Layer):
  """A constructor that computes with ops and reads the result as a NumPy
  number, which fails in a graph: keras_hub's DINOV3Encoder and
  SmolLM3DecoderLayer (their rotary frequencies)."""

  def __init__(self, units, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.scale = float(keras.ops.convert_to_numpy(keras.ops.sqrt(4.0)))
    self.dense = keras.layers.Dense(units)

  def call(self, x):
    return self.dense(x) * self.scale

  def get_config(self):
    return dict(super().get_config(), units=self.units)


class ClassArgument(keras.layers.Layer):
  """Takes a layer class (norm_layer) and keeps it under another name;
  get_config() passes the class to serialize_keras_object, which cannot
  serialise it, and from_config deserialises it: keras_hub's Swin
  PatchEmbedding and SwinTransformerStage."""

  def __init__(self, units, norm_layer=None, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self._norm_cls = norm_layer
    self.dense = keras.layers.Dense(units)
    self.norm = norm_layer(epsilon=1e-3, name='norm')

  def call(self, x):
    return self.norm(self.dense(x))

  def get_config(self):
    return dict(super().get_config(), units=self.units,
                norm_layer=keras.saving.serialize_keras_object(self._norm_cls))

  @classmethod
  def from_config(cls, config):
    config['norm_layer'] = keras.saving.deserialize_keras_object(
        config['norm_layer'])
    return cls(**config)


class InitializerObject(keras.layers.Layer):
  """get_config() returns an initializer object, and an argument has no
  attribute of its name: keras_hub's DFineHybridEncoder."""

  def __init__(self, units, kernel_initializer='zeros', scale=1.0, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self.factor = scale
    self.dense = keras.layers.Dense(
        units, kernel_initializer=self.kernel_initializer)

  def call(self, x):
    return self.dense(x) * self.factor

  def get_config(self):
    return dict(super().get_config(), units=self.units, scale=self.factor,
                kernel_initializer=self.kernel_initializer)


class NoKwargs(keras.Model):
  """A constructor that takes neither name nor dtype (no **kwargs) and no
  get_config(): keras_hub's Flux MLPEmbedder."""

  def __init__(self, units):
    super().__init__()
    self.units = units
    self.dense = keras.layers.Dense(units, activation='silu')

  def call(self, x):
    return self.dense(x)


def Double(x):
  """A module-level function a Lambda calls: importable by name."""
  return x * 2.0


def _Step(test, model, x, k=2):
  targets = tf.nest.map_structure(
      lambda o: tf.random.stateless_normal(o.shape, [7, 7]),
      model(x, training=False))
  want_loss, want = keras_zoo.KerasStep(model, x, targets, 2)
  params = pipeline.FromKeras(model)
  _, loss, got = keras_zoo.PipelineStep(model, params, x, targets, 2,
                                        num_partitions=k, schedule='1f1b')
  test.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
  for var, g, h in zip(model.trainable_variables, want, got):
    test.assertAllClose(g, h, rtol=1e-5, atol=1e-6, msg=var.path)
  return params


class KerasConfigTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.x = tf.random.stateless_normal([4, 5], seed=[2, 2])

  def testLayersWhoseConfigDoesNotRoundTripAreRebuilt(self):
    inputs = keras.Input((5,))
    h = ExtraKeys(6, name='extra')(inputs)
    h = BrokenConfig(6, activation=keras.activations.tanh,
                     kernel_initializer=keras.initializers.RandomNormal(
                         stddev=0.3), scale=0.5, name='broken')(h)
    model = keras.Model(inputs, keras.layers.Dense(2, name='out')(h))
    params = _Step(self, model, self.x)
    by_name = {p.name: p for p in params}
    # ExtraKeys: the constructor arguments Keras recorded, not get_config().
    self.assertNotIn('derived', by_name['extra'].config)
    # BrokenConfig: its attributes, the function and initialiser serialised.
    self.assertEqual(by_name['broken'].config['scale'], 0.5)
    self.assertEqual(by_name['broken'].config['activation']['config'], 'tanh')
    text = layers.SequentialLayer.Params().Set(name='net',
                                               layers=params).ToText()
    self.assertIn('RandomNormal', text)

  def testLayerWhoseConstructorNeedsEagerTensorsConverts(self):
    # FromKeras's rebuild check and the cost estimate (FPropMeta) build
    # the layer in a throwaway graph, where this constructor fails.
    inputs = keras.Input((5,))
    h = EagerScale(3, name='eager')(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name='out')(h))
    params = _Step(self, model, self.x)
    [p] = [p for p in params if p.name == 'eager']
    meta = p.cls.FPropMeta(p, (4, 5))
    self.assertEqual(meta.out_shapes[0], (4, 3))
    self.assertEqual(meta.num_params, 18)

  def testGetConfigsWithAClassOrAKerasObjectAndBareConstructorsConvert(self):
    inputs = keras.Input((5,))
    h = ClassArgument(6, norm_layer=keras.layers.LayerNormalization,
                      name='classy')(inputs)
    h = InitializerObject(
        4, kernel_initializer=keras.initializers.RandomNormal(stddev=0.3),
        scale=0.5, name='init')(h)
    h = NoKwargs(3)(h)  # Named 'no_kwargs' by Keras.
    model = keras.Model(inputs, keras.layers.Dense(2, name='out')(h))
    params = _Step(self, model, self.x)
    by_name = {p.name: p for p in params}
    self.assertEqual(by_name['classy'].config['norm_layer'],
                     {'class_name': 'keras_layer_class',
                      'config': 'keras.layers.LayerNormalization'})
    self.assertEqual(
        by_name['init'].config['kernel_initializer']['class_name'],
        'RandomNormal')
    self.assertEqual(by_name['init'].config['scale'], 0.5)
    self.assertNotIn('dtype', by_name['no_kwargs'].config)
    net = layers.SequentialLayer.Params().Set(
        name='net', layers=params).Instantiate()
    pipeline.LoadKerasWeights(net, model)
    self.assertAllClose(model(self.x), net.FProp(self.x), rtol=1e-5)

  def testConfigsArePlainPython(self):
    inputs = keras.Input((5,))
    model = keras.Model(inputs, TrackedSizes([1, 2], name='sizes')(inputs))
    params = pipeline.FromKeras(model)
    self.assertIs(type(params[0].config['sizes']), list)
    net = layers.SequentialLayer.Params().Set(  # Copies the Params.
        name='net', layers=params).Instantiate()
    self.assertAllClose(net.FProp(self.x), self.x * 3.0)

  def testAttributesThatRebuildAnotherLayerAreRefused(self):
    inputs = keras.Input((5,))
    y = HiddenScale(3, keras.activations.tanh, scale=3.0,
                    kernel_initializer='ones', name='hidden')(inputs)
    with self.assertRaisesRegex(keras_errors.UnsupportedKerasLayerError,
                                'computes other outputs'):
      pipeline.FromKeras(keras.Model(inputs, y))

  def testLambda(self):
    inputs = keras.Input((5,))
    h = keras.layers.Dense(4, name='fc')(inputs)
    h = keras.layers.Lambda(Double, name='double')(h)
    model = keras.Model(inputs, keras.layers.Dense(2, name='out')(h))
    params = _Step(self, model, self.x)
    self.assertEqual(params[1].config['function']['config'], 'Double')
    for fn in (lambda t: t * 2.0, _Local()):
      inputs = keras.Input((5,))
      bad = keras.Model(inputs, keras.layers.Lambda(fn, name='lam')(inputs))
      with self.assertRaisesRegex(keras_errors.KerasLambdaError,
                                  'top level of a module'):
        pipeline.FromKeras(bad)
      self.assertTrue(issubclass(keras_errors.KerasLambdaError, errors.Error))

  def testArrayConstantsAreNumbers(self):
    inputs = keras.Input((5,))
    h = keras.layers.Dense(5, name='fc')(inputs)
    h = h * tf.constant(np.sqrt(5.0), tf.float32)   # Gemma's scale.
    h = keras.ops.add(h, np.arange(5, dtype='float32'))
    model = keras.Model(inputs, keras.layers.Dense(2, name='out')(h))
    params = _Step(self, model, self.x)
    again = layers.SequentialLayer.Params().Set(
        name='net', layers=[p.Copy() for p in params])
    again.FromText(again.ToText())
    seq = again.Instantiate()
    pipeline.LoadKerasWeights(seq, model)
    self.assertAllClose(model(self.x), seq.FProp(self.x), rtol=1e-6)
    inputs = keras.Input((5,))
    big = keras.Model(inputs, inputs + np.ones([10000, 5], 'float32'))
    with self.assertRaisesRegex(keras_errors.UnsupportedKerasLayerError,
                                'keras.Input or a layer weight'):
      pipeline.FromKeras(big)


def _Local():
  def Triple(t):
    return t * 3.0
  return Triple


if __name__ == '__main__':
  tf.test.main()
