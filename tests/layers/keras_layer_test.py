"""KerasLayer: built on its device, variables tracked at stable paths, costs, and Keras BatchNorm/Dropout that stay exact in a pipeline."""

import os

import numpy as np

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import errors
from gpipe_tf.layers import aux_losses
from gpipe_tf.layers import core
from gpipe_tf.layers import keras_layer
from gpipe_tf.layers import normalization
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import PipeliningLayer

KerasLayer = keras_layer.KerasLayer


@keras.saving.register_keras_serializable(package='gpipe_test')
class Scale(keras.layers.Layer):
  """A registered custom layer: x * w."""

  def build(self, input_shape):
    self.w = self.add_weight(name='w', shape=(input_shape[-1],),
                             initializer='ones')

  def call(self, x):
    return x * self.w


@keras.saving.register_keras_serializable(package='gpipe_test')
class AuxLoss(keras.layers.Layer):
  """x * w that, in training, adds a loss scaled by aux_loss_coefficient
  (as keras_hub's MoE router adds its load-balancing loss)."""

  def __init__(self, aux_loss_coefficient=0.1, **kwargs):
    super().__init__(**kwargs)
    self.aux_loss_coefficient = aux_loss_coefficient

  def build(self, input_shape):
    self.w = self.add_weight(name='w', shape=(input_shape[-1],),
                             initializer='ones')

  def call(self, x, training=None):
    if training:
      self.add_loss(self.aux_loss_coefficient * keras.ops.sum(x * x))
    return x * self.w

  def get_config(self):
    return dict(super().get_config(),
                aux_loss_coefficient=self.aux_loss_coefficient)


@keras.saving.register_keras_serializable(package='gpipe_test')
class RecurrentAuxLoss(keras.layers.Layer):
  """A SimpleRNN whose last output's squares, in training, it adds as a
  loss: a layer with a recurrent loop (called with its weights read first)
  that adds a loss."""

  def __init__(self, units=3, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.rnn = keras.layers.SimpleRNN(units)

  def build(self, input_shape):
    self.rnn.build(input_shape)

  def call(self, x, training=None):
    y = self.rnn(x)
    if training:
      self.add_loss(keras.ops.sum(y * y))
    return y

  def get_config(self):
    return dict(super().get_config(), units=self.units)


def _Keras(name, cls, shapes, **config):
  """KerasLayer Params of Keras class `cls` with `config`."""
  return KerasLayer.Params().Set(
      name=name, keras_class=cls, config=config, input_shapes=shapes)


def _Mlp():
  return [_Keras('fc0', 'keras.layers.Dense', [(None, 6)], units=8,
                 activation='tanh'),
          _Keras('ln', 'LayerNormalization', [(None, 8)]),
          _Keras('bn', 'keras.layers.BatchNormalization', [(None, 8)],
                 momentum=0.5),
          _Keras('drop', 'keras.layers.Dropout', [(None, 8)], rate=0.5),
          _Keras('scale', 'gpipe_test>Scale', [(None, 8)]),
          _Keras('fc1', 'Dense', [(None, 8)], units=4)]


def _Pipe(layers, k, m, remat='always', **kw):
  return PipeliningLayer.Params().Set(
      name='net', layers=layers, num_partitions=k, num_micro_batches=m,
      remat=remat, input_shapes=layers[0].input_shapes, **kw).Instantiate()


def _Randomize(variables, seed):
  for i, v in enumerate(variables):
    v.assign(tf.random.stateless_uniform(v.shape, [seed, i], 0.5, 1.5))


class KerasLayerTest(tf.test.TestCase):

  def testBuildsOnItsCellsDeviceWithTreeNamesAndMatchesKeras(self):
    pipe = _Pipe([_Keras('fc0', 'Dense', [(None, 6)], units=6),
                  _Keras('fc', 'keras.layers.Dense', [(None, 6)], units=3)],
                 2, 1)
    net = pipe.layers[1]
    variables = net.trainable_variables
    self.assertEqual(sorted(v.name for v in variables),
                     ['net/fc/bias:0', 'net/fc/kernel:0'])
    for v in variables:
      self.assertIsInstance(v, tf.Variable)
      self.assertEqual(tf.DeviceSpec.from_string(v.device),
                       tf.DeviceSpec.from_string(pipe.devices[1]).replace(
                           job='localhost', replica=0, task=0))
    dense = keras.layers.Dense(3)
    dense.build((None, 6))
    _Randomize(dense.weights, 1)
    pairs = net.LoadKerasWeights(dense)
    self.assertEqual([p[1].name for p in pairs],
                     ['net/fc/kernel:0', 'net/fc/bias:0'])
    x = tf.random.stateless_normal([4, 6], seed=[1, 1])
    self.assertAllClose(dense(x), net.FProp(x))
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(net.FProp(x, training=True))
    self.assertNotIn(None, tape.gradient(loss, variables))

  def testInitialValuesFollowThePath(self):
    layers = _Mlp() + [_Keras('mha', 'MultiHeadAttention', [(None, 3, 4)] * 2,
                              num_heads=2, key_dim=4)]
    seq = core.SequentialLayer.Params().Set(name='net',
                                            layers=layers[:-1]).Instantiate()
    pipe = _Pipe(layers[:-1], 2, 2)
    self.assertEqual([v.name for v in seq.variables],
                     [v.name for v in pipe.variables])
    for a, b in zip(seq.variables, pipe.variables):
      self.assertAllEqual(a, b)
    # A different path draws other values; sublayers draw their own.
    other = _Keras('fc2', 'Dense', [(None, 6)], units=8).Instantiate()
    self.assertNotAllClose(seq.layers[0].keras_weights[0],
                           other.keras_weights[0])
    query, _, key, _, value = layers[-1].Instantiate().keras_weights[:5]
    self.assertNotAllClose(query, key)
    self.assertNotAllClose(query, value)

  def testRoutesInputsKeywordsAndPassthrough(self):
    p = KerasLayer.Params().Set(
        name='attention', keras_class='keras.layers.MultiHeadAttention',
        config={'num_heads': 2, 'key_dim': 3},
        input_shapes=[(None, 5, 4), (None, 7, 4)], inputs=[0],
        input_kwargs={'value': 1}, call_kwargs={'return_attention_scores':
                                                True}, passthrough=[1])
    layer = p.Instantiate()
    mha = keras.layers.MultiHeadAttention(2, 3)
    q = tf.random.stateless_normal([2, 5, 4], seed=[2, 1])
    v = tf.random.stateless_normal([2, 7, 4], seed=[2, 2])
    mha(q, v)
    _Randomize(mha.weights, 2)
    layer.LoadKerasWeights(mha)
    want, scores = mha(q, value=v, return_attention_scores=True)
    got = layer.FProp(q, v)
    self.assertLen(got, 3)
    self.assertAllClose(want, got[0])
    self.assertAllClose(scores, got[1])
    self.assertIs(got[2], v)
    meta = KerasLayer.FPropMeta(p, (None, 5, 4), (None, 7, 4))
    # Keras's own output spec of the scores says (None, 2, 5, 5): not checked.
    self.assertLen(meta.out_shapes, 3)
    self.assertEqual(meta.out_shapes[::2], ((None, 5, 4), (None, 7, 4)))

  def testFPropMetaCountsWithoutCreatingVariables(self):
    created = []

    def _Count(next_creator, **kwargs):
      created.append(kwargs.get('name'))
      return next_creator(**kwargs)

    cases = [
        # 2 x rows x (kernel + bias).
        (_Keras('d', 'Dense', [(None, 5, 8)], units=16),
         2 * 5 * (8 * 16 + 16), ((None, 5, 16),), 8 * 16 + 16),
        # 2 x outputs x (3 x 3 x 3) + bias per output.
        (_Keras('c', 'Conv2D', [(None, 6, 6, 3)], filters=4, kernel_size=3),
         2 * 64 * 27 + 64, ((None, 4, 4, 4),), 3 * 3 * 3 * 4 + 4),
        # Four projections of 72 weights on 5 rows, QK^T and AV (2 x 1 x 2
        # heads x 5 x 5 x (4 + 4)), softmax 5 per score.
        (_Keras('a', 'MultiHeadAttention', [(None, 5, 8), (None, 5, 8)],
                num_heads=2, key_dim=4),
         2 * 5 * 288 + 800 + 250, ((None, 5, 8),), 288)]
    for p, flops, out_shapes, num_params in cases:
      with self.subTest(layer=p.keras_class):
        with tf.variable_creator_scope(_Count):
          meta = KerasLayer.FPropMeta(p, *p.input_shapes)
        self.assertEqual(created, [])
        self.assertEqual((meta.flops, meta.out_shapes, meta.num_params),
                         (flops, out_shapes, num_params))
        layer = p.Instantiate()
        self.assertEqual(layer.NumParams(), num_params)
        xs = [tf.zeros((2,) + s[1:]) for s in p.input_shapes]
        self.assertEqual(layer.FProp(*xs).shape[1:], out_shapes[0][1:])

  def testCostProfileBalances(self):
    layers = _Mlp()[:2] + _Mlp()[-2:]
    pipe = _Pipe(layers, 2, 2, cost='profile', profile_batch_size=4)
    self.assertEqual(sum(pipe.balance), 4)
    self.assertLen(pipe.balance, 2)
    self.assertEqual(pipe.FProp(tf.ones([4, 6])).shape, [4, 4])

  def testCheckpointMovesBetweenSequentialAndAnyPipeline(self):
    seq = core.SequentialLayer.Params().Set(name='net',
                                            layers=_Mlp()).Instantiate()
    _Randomize(seq.variables, 3)
    path = tf.train.Checkpoint(model=seq).write(
        os.path.join(self.get_temp_dir(), 'ckpt'))
    keys = sorted(name for name, _ in tf.train.list_variables(path))
    self.assertTrue(any('keras_weights' in k for k in keys), keys)
    want = {v.name: v.numpy() for v in seq.variables}
    self.assertLen(want, 2 + 2 + 4 + 1 + 2)
    for k, m in ((2, 3), (4, 2)):
      with self.subTest(k=k, m=m):
        pipe = _Pipe(_Mlp(), k, m)
        tf.train.Checkpoint(model=pipe).read(path).assert_consumed()
        self.assertEqual({v.name: v.numpy().tolist() for v in pipe.variables},
                         {n: v.tolist() for n, v in want.items()})

  def testKerasBatchNormMovesOncePerMiniBatchNotInRecompute(self):
    layers = [_Keras('bn', 'BatchNormalization', [(None, 3)], momentum=0.5),
              _Keras('fc', 'Dense', [(None, 3)], units=2)]
    pipe = _Pipe(layers, 2, 4, remat='always')
    bn = {v.name.split('/')[-1][:-2]: v for v in pipe.layers[0].variables}
    x = tf.random.stateless_normal([8, 3], seed=[4, 4]) * 3.0 + 1.0
    with tf.GradientTape() as tape:
      y = pipe.FProp(x, training=True)
      loss = tf.reduce_sum(tf.sin(y))
    grads = tape.gradient(loss, pipe.trainable_variables)
    self.assertNotIn(None, grads)
    mean, variance = tf.nn.moments(x, axes=[0])
    self.assertAllClose(0.5 * 0.0 + 0.5 * mean, bn['moving_mean'])
    self.assertAllClose(0.5 * 1.0 + 0.5 * variance, bn['moving_variance'])
    # Each micro-batch was normalised with its own statistics, as a Keras
    # BatchNormalization in training normalises each batch it is called on.
    keras_bn = keras.layers.BatchNormalization()
    keras_bn.build((None, 3))
    normalised = tf.concat([keras_bn(xm, training=True)
                            for xm in tf.split(x, 4)], axis=0)
    self.assertAllClose(pipe.layers[1].FProp(normalised), y, rtol=1e-5,
                        atol=1e-5)
    self.assertIsInstance(pipe.layers[0].native, normalization.BatchNormLayer)

  def testKerasDropoutMasksRepeatInRecompute(self):
    layers = [_Keras('fc0', 'Dense', [(None, 6)], units=8),
              _Keras('drop', 'Dropout', [(None, 8)], rate=0.5),
              _Keras('fc1', 'Dense', [(None, 8)], units=8),
              _Keras('fc2', 'Dense', [(None, 8)], units=3)]
    x = tf.random.stateless_normal([8, 6], seed=[5, 5])
    results = []
    for remat in ('always', 'never'):
      pipe = _Pipe(layers, 2, 2, remat=remat, balance=[2, 2])
      with random_seeds.StepSeedScope(tf.constant([7, 7], tf.int64)):
        with tf.GradientTape() as tape:
          dropped = pipe.FProp(x, training=True)
          loss = tf.reduce_sum(tf.sin(dropped))
      results.append((dropped, tape.gradient(loss, pipe.trainable_variables)))
    (y1, g1), (y2, g2) = results
    self.assertAllClose(y1, y2)
    for a, b in zip(g1, g2):  # The recompute ('always') redrew the masks.
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)
    self.assertIsInstance(pipe.layers[1].native, core.DropoutLayer)
    kept = pipe.layers[1].FProp(tf.ones([8, 8]), training=True)
    self.assertBetween(float(tf.reduce_mean(tf.cast(kept > 0, tf.float32))),
                       0.2, 0.8)

  def testAddedLossGoesToTheAuxiliaryLossesInScope(self):
    # A loss a Keras layer adds with add_loss in training goes to the
    # aux_losses.Collect() in scope (the loss that trains the layer adds
    # it, as Keras adds model.losses); with none in scope it is refused,
    # not dropped; inference adds none.
    x = tf.random.stateless_normal([4, 3], seed=[6, 6])
    layer = _Keras('aux', 'gpipe_test>AuxLoss', [(None, 3)],
                   aux_loss_coefficient=0.1).Instantiate()
    self.assertEqual(layer.FProp(x).shape, [4, 3])
    with aux_losses.Collect() as aux:
      layer.FProp(x)
      self.assertEmpty(aux.terms)
      layer.FProp(x, training=True)
    self.assertAllClose(aux.Total(), 0.1 * tf.reduce_sum(x * x))
    self.assertEmpty(layer.keras_layer.losses)  # Taken, not left behind.
    with self.assertRaisesRegex(aux_losses.AuxLossNotCollectedError,
                                r"KerasLayer 'aux' \(AuxLoss\) adds"):
      layer.FProp(x, training=True)
    # A layer with a recurrent loop runs in a keras.StatelessScope, which
    # holds its losses: they are taken from it too.
    rnn = _Keras('rnn', 'gpipe_test>RecurrentAuxLoss',
                 [(None, 5, 3)]).Instantiate()
    with aux_losses.Collect() as aux:
      y = rnn.FProp(tf.reshape(tf.range(30, dtype=tf.float32) / 30,
                               [2, 5, 3]), training=True)
    self.assertGreater(float(aux.Total()), 0.0)
    self.assertAllClose(aux.Total(), tf.reduce_sum(y * y))

  def testBadParamsRaiseNamedErrors(self):
    cases = [
        (_Keras('x', 'keras.layers.NoSuchLayer', [(None, 3)]),
         keras_layer.UnknownKerasClassError, 'importable path'),
        (_Keras('x', 'NoSuchLayer', [(None, 3)]),
         keras_layer.UnknownKerasClassError, 'registered name'),
        (_Keras('x', 'numpy.ndarray', [(None, 3)]),
         keras_layer.UnknownKerasClassError, 'not a Keras layer class'),
        (_Keras('x', 'Dense', None, units=2),
         keras_layer.KerasInputShapeError, r'\[\(None, 28, 28, 1\)\]'),
        (_Keras('x', 'Dense', [(None, 3)], units=2, kernel_regularizer='l2'),
         keras_layer.UnsupportedKerasLayerError, 'Set it to None'),
        (_Keras('x', 'BatchNormalization', [(None, 3)], trainable=False),
         keras_layer.UnsupportedKerasLayerError, 'inference mode'),
        (_Keras('x', 'BatchNormalization', [(None, 3)], axis=0),
         keras_layer.UnsupportedKerasLayerError, r"axis=0 \(use -1"),
        (_Keras('x', 'Dense', [(None, 3)], units=2).Set(passthrough=[1]),
         errors.Error, 'indices of its 1 inputs'),
    ]
    for p, error, message in cases:
      with self.subTest(keras_class=p.keras_class, message=message):
        with self.assertRaisesRegex(error, message):
          p.Instantiate()
        self.assertTrue(issubclass(error, errors.Error))
    layer = _Keras('x', 'Dense', [(None, 3)], units=2).Instantiate()
    with self.assertRaisesRegex(errors.Error, r'expects inputs of shapes'):
      layer.FProp(tf.ones([2, 4]))

  def testClassPathsRoundTrip(self):
    for cls, path in ((keras.layers.Dense, 'keras.layers.Dense'),
                      (Scale, 'gpipe_test>Scale')):
      self.assertEqual(keras_layer.KerasClassPath(cls), path)
      self.assertIs(keras_layer.ResolveKerasClass(path), cls)
    self.assertIs(keras_layer.ResolveKerasClass('Dense'), keras.layers.Dense)

    class Local(keras.layers.Layer):
      pass

    with self.assertRaisesRegex(keras_layer.UnknownKerasClassError,
                                'register_keras_serializable'):
      keras_layer.KerasClassPath(Local)


class FrozenKerasLayerTest(tf.test.TestCase):

  def _Model(self):
    keras.utils.set_random_seed(5)
    x = inputs = keras.Input((6,))
    x = keras.layers.Dense(8, activation='tanh', name='fc0')(x)
    x = keras.layers.Dense(8, activation='tanh', name='frozen')(x)
    x = keras.layers.Dense(8, activation='tanh', name='fc1')(x)
    model = keras.Model(inputs, keras.layers.Dense(3, name='logits')(x))
    model.get_layer('frozen').trainable = False  # A fine-tuner's freeze.
    model.compile(keras.optimizers.SGD(0.5), 'mse')
    return model

  def testFrozenLayerStepsAsKerasAndIsCheckpointed(self):
    from gpipe_tf.train import keras_model  # pylint: disable=g-import-not-at-top
    from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
    rng = np.random.RandomState(0)
    x, y = rng.randn(8, 6).astype(np.float32), rng.randn(8, 3)
    want = self._Model()
    frozen_before = [w.numpy() for w in want.get_layer('frozen').weights]
    want_loss = want.train_on_batch(x, y)
    keras_net = self._Model()
    model = keras_model.PipelineModel(PipeliningLayer.Params().Set(
        name='net', layers=pipeline.FromKeras(keras_net), num_partitions=2,
        num_micro_batches=2, schedule='1f1b'))
    pairs = dict((id(k), v) for k, v in
                 pipeline.LoadKerasWeights(model.layer, keras_net))
    frozen = [pairs[id(w)] for w in keras_net.get_layer('frozen').weights]
    trainable = {id(v) for v in model.layer.trainable_variables}
    self.assertLen(trainable, 6)  # fc0, fc1, logits: kernels and biases.
    self.assertFalse(any(id(v) in trainable for v in frozen))
    model.compile(keras.optimizers.SGD(0.5), 'mse')
    self.assertAllClose(want_loss, model.train_on_batch(x, y), rtol=1e-5)
    for w, mine in zip(want.weights, keras_net.weights):
      self.assertAllClose(w.numpy(), pairs[id(mine)].numpy(), rtol=1e-5,
                          atol=1e-6)
    for before, v in zip(frozen_before, frozen):
      self.assertAllEqual(before, v.numpy())  # Never updated.
    # Checkpoints hold the frozen weights.
    path = tf.train.Checkpoint(net=model.layer).write(
        os.path.join(self.get_temp_dir(), 'ckpt'))
    for v in frozen:
      v.assign(tf.zeros_like(v))
    tf.train.Checkpoint(net=model.layer).read(path).assert_consumed()
    for before, v in zip(frozen_before, frozen):
      self.assertAllEqual(before, v.numpy())


if __name__ == '__main__':
  tf.test.main()
