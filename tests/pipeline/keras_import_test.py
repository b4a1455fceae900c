"""FromKeras + LoadKerasWeights: a pipeline over an imported Keras model computes the Keras model's loss and gradients.

For a small CNN (Conv2D, BatchNormalization, Dropout, Dense) and a small
functional Transformer (MultiHeadAttention, LayerNormalization, Dense,
residual Adds), every registered schedule (schedule.Names(), each at the
first of V = 1, 2 (2, 1 for interleaved_1f1b) and M = 2, 2K it accepts)
and K in {1, 2, 4}:
``ComputeLossAndGradients`` equals a Keras ``tf.GradientTape`` step over the
same M micro-batches (BatchNorm normalises each micro-batch with its own
statistics in both), the moving statistics after the step equal one update
from the pooled statistics of all micro-batches, and inference equals
``model(x, training=False)``. Dropout runs at rate 0 here; its masks are
tested in keras_layer_test.
"""

import itertools

import numpy as np

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import keras  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import errors
from gpipe_tf import layers
from gpipe_tf import pipeline
from gpipe_tf.layers import losses
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline import transfers
from tools.keras_zoo import main as keras_zoo



def _Layouts():
  """(schedule, K, M, V) for every registered schedule at K = 4, and gpipe
  at K = 1 (one stage: every schedule runs it alike) and K = 2: the first M
  in (2, 2K) and V in (1, 2) the schedule accepts; V = 2 first for
  interleaved_1f1b, so that it runs two stages a device.

  K = 4 cuts the model at the most places (8 stages at V = 2), so each
  schedule runs the converted layers across the most cell boundaries; the
  K = 2 cuts run once, under gpipe (each schedule's own K = 2 runs are
  schedule_transparency_test's and schedule_vshape_test's).
  """
  layouts = [('gpipe', 1, 2, 1)]
  for name, k in [('gpipe', 2)] + [(n, 4) for n in schedule.Names()]:
    vs = (2, 1) if name == 'interleaved_1f1b' else (1, 2)
    for m, v in itertools.product(sorted({2, 2 * k}), vs):
      try:
        schedule.Make(name, k, m, v)
      except schedule.ScheduleError:
        continue
      layouts.append((name, k, m, v))
      break
    else:
      raise AssertionError(f'{name} accepts no layout at K={k}')
  return layouts


def _Cnn(dropout=0.0):
  return keras.Sequential([
      keras.Input((6, 6, 3)),
      keras.layers.Conv2D(4, 3, padding='same', name='conv0'),
      keras.layers.BatchNormalization(momentum=0.8, name='bn0'),
      keras.layers.Activation('relu', name='relu0'),
      keras.layers.Conv2D(4, 3, name='conv1'),
      keras.layers.BatchNormalization(momentum=0.8, name='bn1'),
      keras.layers.Activation('relu', name='relu1'),
      keras.layers.Dropout(dropout, name='drop'),
      keras.layers.GlobalAveragePooling2D(name='pool'),
      keras.layers.Dense(5, name='logits')], name='cnn')


def _Transformer(blocks, d=8):
  inputs = keras.Input((5, d))
  x = inputs
  for b in range(blocks):
    h = keras.layers.LayerNormalization(name=f'ln{b}a')(x)
    h = keras.layers.MultiHeadAttention(2, 4, name=f'mha{b}')(h, h)
    x = keras.layers.Add(name=f'res{b}a')([x, h])
    h = keras.layers.LayerNormalization(name=f'ln{b}b')(x)
    h = keras.layers.Dense(16, activation='relu', name=f'ff{b}a')(h)
    h = keras.layers.Dense(d, name=f'ff{b}b')(h)
    x = keras.layers.Add(name=f'res{b}b')([x, h])
  x = keras.layers.GlobalAveragePooling1D(name='pool')(x)
  return keras.Model(inputs, keras.layers.Dense(5, name='logits')(x),
                     name='transformer')


@keras.saving.register_keras_serializable(package='gpipe_tf_test')
class CustomGradientSwish(keras.layers.Layer):
  """x * sigmoid(x) with a hand-written gradient (tf.custom_gradient: an
  IdentityN op in the graph, as Keras's own swish)."""

  def call(self, x):

    @tf.custom_gradient
    def _Swish(x):
      s = tf.sigmoid(x)

      def _Grad(dy):
        return dy * s * (1.0 + x * (1.0 - s))

      return x * s, _Grad

    return _Swish(x)


@keras.saving.register_keras_serializable(package='gpipe_tf_test')
class Shifted(keras.layers.Layer):
  """x + offsets, the offsets a constant keyword argument of the call."""

  def call(self, x, offsets=None):
    return x + keras.ops.convert_to_tensor(offsets)


class Table(keras.layers.Layer):
  """Its weights as one row, whatever the batch."""

  def build(self, input_shape):
    self.w = self.add_weight(name='w', shape=(input_shape[-1],))

  def call(self, x):
    return keras.ops.expand_dims(self.w, 0)


class GatedSum(keras.layers.Layer):
  """Called as layer(x, None, y) the first time and layer(x, v, y) after:
  keras_hub's RWKV7 blocks pass their v_first so."""

  def call(self, x, first=None, gate=None):
    v = x if first is None else first
    return x + v * keras.ops.sigmoid(gate)


def _SqueezeExcite():
  """A swish output read across a GlobalAveragePooling2D -> Reshape ->
  Conv2D branch and by the Multiply after it (EfficientNet's block), with
  gelu and a custom-gradient layer: 10 layers, 9 places to cut."""
  inputs = keras.Input((6, 6, 3))
  a = keras.layers.Conv2D(4, 3, padding='same', name='conv')(inputs)
  a = keras.layers.Activation('swish', name='swish')(a)
  s = keras.layers.GlobalAveragePooling2D(name='squeeze')(a)
  s = keras.layers.Reshape((1, 1, 4), name='reshape')(s)
  s = keras.layers.Conv2D(2, 1, activation='gelu', name='reduce')(s)
  s = CustomGradientSwish(name='custom')(s)
  s = keras.layers.Conv2D(4, 1, activation='sigmoid', name='expand')(s)
  y = keras.layers.Multiply(name='excite')([a, s])
  y = keras.layers.GlobalAveragePooling2D(name='pool')(y)
  return keras.Model(inputs, keras.layers.Dense(5, name='logits')(y),
                     name='squeeze_excite')


def _UNet():
  """Two levels down and up, each decoder level concatenated with the
  encoder tensor of its size (two nested long skips), then a classifier:
  13 calls."""
  x = inputs = keras.Input((8, 8, 3))
  skips = []
  for level in range(2):
    x = keras.layers.Conv2D(2 << level, 3, padding='same', activation='tanh',
                            name=f'down{level}')(x)
    skips.append(x)
    x = keras.layers.MaxPooling2D(2, name=f'pool{level}')(x)
  x = keras.layers.Conv2D(8, 3, padding='same', activation='tanh',
                          name='bottom')(x)
  for level in reversed(range(2)):
    x = keras.layers.UpSampling2D(2, name=f'up{level}')(x)
    x = keras.layers.Concatenate(name=f'cat{level}')([x, skips[level]])
    x = keras.layers.Conv2D(2 << level, 3, padding='same', activation='tanh',
                            name=f'dec{level}')(x)
  x = keras.layers.GlobalAveragePooling2D(name='pool')(x)
  return keras.Model(inputs, keras.layers.Dense(5, name='logits')(x),
                     name='unet')


def _Randomize(model, seed):
  """Random weights everywhere (moving variances positive), so no weight
  sits at an initial value that hides a wrong copy."""
  rng = np.random.default_rng(seed)
  model.set_weights([
      rng.uniform(0.5, 1.5, w.shape) if 'variance' in w.path else
      rng.normal(0.0, 0.5, w.shape) for w in model.weights])


def _PerExample(logits, labels):
  return losses.SoftmaxCrossEntropy(logits, labels)


def _LossFn(logits, labels):
  return loss_lib.LossTerms(_PerExample(logits, labels))


def _KerasStep(model, x, y, m):
  """Keras's own tape step over the pipeline's m micro-batches: the loss is
  the mean over all examples, each micro-batch a separate training call."""
  return keras_zoo.KerasStep(model, x, y, m, _PerExample)


def _MovingStats(model, x, m):
  """BatchNormalization moving statistics after one update from the pooled
  statistics of both micro-batches, each normalised by Keras with its own
  statistics on the way (so bn1's input is the pipeline's)."""
  bns = [l for l in model.layers
         if isinstance(l, keras.layers.BatchNormalization)]
  if not bns:
    return {}
  start = {w.path: w.numpy() for w in model.non_trainable_weights}
  probe = keras.Model(model.inputs, [l.input for l in bns])
  per_micro_batch = [probe(xm, training=True) for xm in tf.split(x, m)]
  want = {}
  for j, bn in enumerate(bns):
    z = tf.concat([inputs[j] for inputs in per_micro_batch], axis=0)
    mean, variance = tf.nn.moments(z, axes=[0, 1, 2])
    for var, stat in ((bn.moving_mean, mean), (bn.moving_variance, variance)):
      want[var.path] = (start[var.path] * bn.momentum +
                        stat * (1.0 - bn.momentum))
  return want


class FromKerasTest(tf.test.TestCase):

  def _AssertGrid(self, model, x, y):
    _Randomize(model, seed=7)
    start = model.get_weights()
    params = pipeline.FromKeras(model)
    want_eval = model(x, training=False)
    want = {}  # M -> (loss, {id(Keras variable): gradient}, moving stats).
    evaluated = set()  # The (K, V) cuts whose inference was checked.
    for name, k, m, v in _Layouts():
      with self.subTest(schedule=name, k=k, m=m, v=v):
        if m not in want:
          model.set_weights(start)
          loss, grads = _KerasStep(model, x, y, m)
          model.set_weights(start)
          stats = _MovingStats(model, x, m)
          self.assertLen(stats, len(model.non_trainable_weights))
          model.set_weights(start)
          want[m] = (loss, dict(zip(map(id, model.trainable_variables),
                                    grads)), stats)
        want_loss, want_grads, want_stats = want[m]
        pipe = pipeline.PipeliningLayer.Params().Set(
            name='net', layers=params, num_partitions=k, num_micro_batches=m,
            schedule=name, num_virtual_stages=v, remat='always',
            input_shapes=params[0].input_shapes).Instantiate()
        self.assertLen(pipe.balance, k * v)
        pairs = pipeline.LoadKerasWeights(pipe, model)
        self.assertLen(pairs, len(model.weights))
        # Inference once per cut of the model (K x V stages), under the
        # first schedule that makes it (4 inference steps, not 8): the
        # converted layers across the cuts are what this checks; every
        # schedule's inference is support_test.testEveryCell's, and every
        # schedule runs these layers in the training step below.
        if (k, v) not in evaluated:
          evaluated.add((k, v))
          self.assertAllClose(want_eval, pipe.FProp(x, training=False),
                              rtol=1e-5, atol=1e-6)
        loss, _, grads = pipe.ComputeLossAndGradients(x, y, _LossFn)
        self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
        got = dict(zip(map(id, pipe.trainable_variables), grads))
        self.assertLen(got, len(want_grads))
        for keras_var, var in pairs:
          if keras_var.trainable:
            self.assertAllClose(want_grads[id(keras_var)], got[id(var)],
                                rtol=1e-5, atol=1e-6, msg=keras_var.path)
          else:  # Moved once, from all micro-batches.
            self.assertAllClose(want_stats[keras_var.path], var,
                                rtol=1e-5, atol=1e-6, msg=keras_var.path)

  def testCnnEveryScheduleAndK(self):
    x = tf.random.stateless_normal([8, 6, 6, 3], seed=[1, 2])
    y = tf.random.stateless_uniform([8], [3, 4], 0, 5, tf.int32)
    self._AssertGrid(_Cnn(), x, y)

  def testTransformerEveryScheduleAndK(self):
    x = tf.random.stateless_normal([8, 5, 8], seed=[5, 6])
    y = tf.random.stateless_uniform([8], [7, 8], 0, 5, tf.int32)
    self._AssertGrid(_Transformer(blocks=1), x, y)  # 9 layers: K x V <= 8.

  def testUNetSkipsGoStraightFromEncoderToDecoder(self):
    # down0's output is stashed by pool0 (cell 0) and popped by cat0 (cell
    # 3), down1's by pool1 (cell 1) for cat1 (cell 2): with stash/pop the
    # middle devices receive less than with the tuple, the end ones the
    # same, and the step is Keras's.
    model = _UNet()
    _Randomize(model, seed=3)
    x = tf.random.stateless_normal([4, 8, 8, 3], seed=[1, 2])
    y = tf.random.stateless_uniform([4], [3, 4], 0, 5, tf.int32)
    want_loss, want_grads = _KerasStep(model, x, y, 2)
    want_grads = dict(zip(map(id, model.trainable_variables), want_grads))
    received = {}
    for skips in (True, False):
      params = pipeline.FromKeras(model, skips=skips)
      self.assertEqual(any(p.stash for p in params), skips)
      pipe = pipeline.PipeliningLayer.Params().Set(
          name='net', layers=params, num_partitions=4, num_micro_batches=2,
          schedule='1f1b', balance=[2, 3, 3, 5],
          execution='unrolled').Instantiate()
      pairs = pipeline.LoadKerasWeights(pipe, model)
      loss, _, grads = pipe.ComputeLossAndGradients(x, y, _LossFn)
      self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
      got = dict(zip(map(id, pipe.trainable_variables), grads))
      self.assertLen(got, len(want_grads))
      for keras_var, var in pairs:
        self.assertAllClose(want_grads[id(keras_var)], got[id(var)],
                            rtol=1e-5, atol=1e-6, msg=keras_var.path)
      step = tf.function(lambda p=pipe: p.ComputeLossAndGradients(
          x, y, _LossFn)[0])
      by_device = transfers.ReceivedBytes(step.get_concrete_function().graph)
      received[skips] = [by_device[f'CPU:{d}'] for d in range(4)]
    self.assertEqual([p.name for p in pipeline.FromKeras(model)][:4],
                     ['down0', 'pool0', 'down1', 'pool1'])
    stash, carry = received[True], received[False]
    self.assertEqual((stash[0], stash[3]), (carry[0], carry[3]))
    self.assertLess(stash[1], carry[1])
    self.assertLess(stash[2], carry[2])

  def testCustomGradientsCutAtEveryPlace(self):
    # The output of a custom-gradient op (swish's IdentityN) crossing a cut
    # made the backward's prune fail (KeyError in lift_to_graph).
    model = _SqueezeExcite()
    _Randomize(model, seed=3)
    x = tf.random.stateless_normal([4, 6, 6, 3], seed=[3, 1])
    y = tf.random.stateless_uniform([4], [3, 2], 0, 5, tf.int32)
    want_loss, want_grads = _KerasStep(model, x, y, 2)
    params = pipeline.FromKeras(model)
    self.assertLen(params, 10)
    # Each of the 9 places is cut by one of three K=4 pipelines (3 cuts
    # each), not one K=2 pipeline a place: a third of the layers to trace.
    for balance in ([1, 1, 1, 7], [4, 1, 1, 4], [7, 1, 1, 1]):
      with self.subTest(balance=balance):
        _, loss, got = keras_zoo.PipelineStep(
            model, params, x, y, 2, _PerExample, num_partitions=4,
            balance=balance)
        self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
        for var, g, h in zip(model.trainable_variables, want_grads, got):
          self.assertAllClose(g, h, rtol=1e-5, atol=1e-6, msg=var.path)

  def testInputShapesComeFromTheParams(self):
    params = pipeline.FromKeras(_Transformer(blocks=1))
    implied = pipeline.PipeliningLayer.Params().Set(
        name='net', layers=params, num_partitions=2)
    explicit = implied.Copy().Set(input_shapes=params[0].input_shapes)
    self.assertEqual(explicit.Instantiate().balance,
                     implied.Instantiate().balance)
    self.assertEqual(pipeline.PipeliningLayer.CellMetas(explicit),
                     pipeline.PipeliningLayer.CellMetas(implied))

  def testResidualBlockStashesTheStreamForTheAdd(self):
    params = pipeline.FromKeras(_Transformer(blocks=1))
    routes = [(p.name, p.inputs, p.passthrough, len(p.input_shapes),
               len(p.stash), len(p.pop)) for p in params]
    self.assertEqual(routes, [
        ('ln0a', [0], [0], 1, 1, 0),       # (x,) -> (h,), x stashed
        ('mha0', [0, 0], [], 1, 0, 0),     # mha(h, h): (h,) -> (a,)
        ('res0a', [[1, 0]], [], 2, 0, 1),  # x popped: Add([x, a]) -> (x,)
        ('ln0b', [0], [0], 1, 1, 0),
        ('ff0a', [0], [], 1, 0, 0),
        ('ff0b', [0], [], 1, 0, 0),
        ('res0b', [[1, 0]], [], 2, 0, 1),
        ('pool', [0], [], 1, 0, 0),
        ('logits', [0], [], 1, 0, 0)])
    self.assertEqual(params[0].stash, params[2].pop)

  def testResidualBlockBecomesTupleChainWithoutSkips(self):
    params = pipeline.FromKeras(_Transformer(blocks=1), skips=False)
    self.assertFalse(any(p.stash or p.pop for p in params))
    routes = [(p.name, p.inputs, p.passthrough, len(p.input_shapes))
              for p in params]
    self.assertEqual(routes, [
        ('ln0a', [0], [0], 1),       # (x,) -> (h, x)
        ('mha0', [0, 0], [1], 2),    # mha(h, h): (h, x) -> (a, x)
        ('res0a', [[1, 0]], [], 2),  # Add([x, a]) -> (x,)
        ('ln0b', [0], [0], 1),
        ('ff0a', [0], [1], 2),
        ('ff0b', [0], [1], 2),
        ('res0b', [[1, 0]], [], 2),
        ('pool', [0], [], 1),
        ('logits', [0], [], 1)])

  def testParamsAreDeclarative(self):
    model = _Cnn(dropout=0.5)
    params = pipeline.FromKeras(model)
    text = layers.SequentialLayer.Params().Set(name='net',
                                               layers=params).ToText()
    again = layers.SequentialLayer.Params().Set(
        name='net', layers=[layers.KerasLayer.Params() for _ in params])
    again.FromText(text)
    self.assertEqual(text, again.ToText())
    net = again.Instantiate()
    pipeline.LoadKerasWeights(net, model)
    x = tf.random.stateless_normal([4, 6, 6, 3], seed=[9, 9])
    self.assertAllClose(model(x, training=False), net.FProp(x), rtol=1e-5,
                        atol=1e-6)

  def _AssertSameStep(self, model, x, targets, k=2, m=2, schedule='1f1b'):
    """The pipeline's loss and gradients (a squared error over every output)
    equal Keras's tape step over the same m micro-batches."""
    want_loss, want = keras_zoo.KerasStep(model, x, targets, m)
    params = pipeline.FromKeras(model)
    pipe, loss, got = keras_zoo.PipelineStep(
        model, params, x, targets, m, num_partitions=k, schedule=schedule)
    self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
    self.assertLen(pipe.trainable_variables, len(want))
    for var, g, h in zip(model.trainable_variables, want, got):
      self.assertAllClose(g, h, rtol=1e-5, atol=1e-6, msg=var.path)
    return pipe, params

  def testOperationNodesBecomeLayers(self):
    # What keras.applications' own code writes (ConvNeXt, MobileNetV3).
    inputs = keras.Input((6, 4))
    h = keras.layers.Dense(4, name='dense')(inputs)
    y = h + inputs
    y = keras.ops.concatenate([y * 2.0, keras.ops.mean(
        y, axis=-1, keepdims=True)], axis=-1)[:, 1:, ...]
    y = keras.ops.relu(1.0 - y) @ y[:, :, :3]
    model = keras.Model(inputs, y, name='ops')
    _Randomize(model, seed=2)
    params = pipeline.FromKeras(model)
    # (Keras numbers operation names per process: compare the classes.)
    self.assertEqual(
        [p.cls.__name__ for p in params][:4],
        ['KerasLayer', 'KerasOpLayer', 'KerasOpLayer', 'KerasOpLayer'])
    text = layers.SequentialLayer.Params().Set(name='net',
                                               layers=params).ToText()
    self.assertIn("'__slice__'", text)  # Params stay text.
    x = tf.random.stateless_normal([4, 6, 4], seed=[2, 2])
    pipe, _ = self._AssertSameStep(
        model, x, tf.random.stateless_normal([4, 5, 3], seed=[2, 3]))
    self.assertAllClose(model(x), pipe.FProp(x), rtol=1e-5, atol=1e-6)

  def testSeveralOutputsComeInTheModelsStructure(self):
    inputs = keras.Input((4,))
    h = keras.layers.Dense(5, activation='tanh', name='h')(inputs)
    model = keras.Model(inputs, {'logits': keras.layers.Dense(3)(h),
                                 'features': h}, name='two')
    _Randomize(model, seed=4)
    x = tf.random.stateless_normal([4, 4], seed=[4, 4])
    targets = {'logits': tf.random.stateless_normal([4, 3], seed=[4, 5]),
               'features': tf.random.stateless_normal([4, 5], seed=[4, 6])}
    pipe, params = self._AssertSameStep(model, x, targets)
    self.assertEqual(params[-1].cls.__name__, 'KerasOutputs')
    got = pipe.FProp(x)
    self.assertEqual(sorted(got), ['features', 'logits'])
    for key, value in model(x).items():
      self.assertAllClose(value, got[key], rtol=1e-5, atol=1e-6)

  def testNestedModelCalledWithADictIsInlined(self):
    # A keras_hub task model calls its backbone with a dict of tensors.
    ids, scale = keras.Input((5,), dtype='int32'), keras.Input((5, 1))
    inner_ids, inner_scale = keras.Input((5,), dtype='int32'), keras.Input(
        (5, 1))
    e = keras.layers.Embedding(10, 4, name='embed')(inner_ids)
    backbone = keras.Model(
        {'ids': inner_ids, 'scale': inner_scale},
        keras.layers.Multiply(name='scaled')([e, inner_scale]),
        name='backbone')
    h = backbone({'scale': scale, 'ids': ids})
    model = keras.Model({'ids': ids, 'scale': scale},
                        keras.layers.Dense(2, name='head')(h), name='task')
    _Randomize(model, seed=5)
    params = pipeline.FromKeras(model)
    self.assertEqual([p.name for p in params],
                     ['inputs', 'embed', 'scaled', 'head'])
    x = {'ids': tf.random.stateless_uniform([4, 5], [5, 1], 0, 10, tf.int32),
         'scale': tf.random.stateless_normal([4, 5, 1], seed=[5, 2])}
    self._AssertSameStep(model, x,
                         tf.random.stateless_normal([4, 5, 2], seed=[5, 3]))

  def testTiedLayerIsOneSetOfVariables(self):
    # An embedding read at two places and a block called twice, in
    # different cells.
    ids = keras.Input((5,), dtype='int32')
    embed = keras.layers.Embedding(10, 4, name='embed')
    block = keras.layers.Dense(4, activation='tanh', name='block')
    h = block(block(embed(ids)))
    h = keras.layers.Concatenate(name='concat')([
        h, embed(keras.ops.flip(ids, axis=1))])
    model = keras.Model(ids, keras.layers.Dense(3, name='head')(
        keras.layers.Flatten(name='flat')(h)), name='tied')
    _Randomize(model, seed=6)
    x = tf.random.stateless_uniform([4, 5], [6, 1], 0, 10, tf.int32)
    target = tf.random.stateless_normal([4, 3], seed=[6, 2])
    params = pipeline.FromKeras(model)
    self.assertEqual([(p.name, p.share) for p in params if 'share' in p],
                     [('embed', None), ('block', None),
                      ('block.call2', 'block'), ('embed.call2', 'embed'),
                      ('concat', None), ('flat', None), ('head', None)])
    for k in (2, 4):
      with self.subTest(k=k):
        pipe, _ = self._AssertSameStep(model, x, target, k=k, m=2,
                                       schedule='zb_h1')
        self.assertLen(pipe.trainable_variables,
                       len(model.trainable_variables))

  def testInputsByName(self):
    ids, mask = (keras.Input((5,), dtype='int32', name='token_ids'),
                 keras.Input((5,), dtype='int32', name='padding_mask'))
    h = keras.layers.Embedding(10, 4, name='embed')(ids)
    h = h * keras.ops.expand_dims(keras.ops.cast(mask, 'float32'), -1)
    dict_model = keras.Model({'token_ids': ids, 'padding_mask': mask},
                             keras.layers.Dense(2, name='head')(h))
    list_model = keras.Model([ids, mask], dict_model.output)
    x_ids = tf.random.stateless_uniform([4, 5], [7, 1], 1, 10, tf.int32)
    x_mask = tf.constant([[1] * 5, [1] * 3 + [0] * 2] * 2)
    feed = {'token_ids': x_ids, 'padding_mask': x_mask}
    for model in (dict_model, list_model):
      net = layers.SequentialLayer.Params().Set(
          name='net', layers=pipeline.FromKeras(model)).Instantiate()
      pipeline.LoadKerasWeights(net, model)
      self.assertAllClose(dict_model(feed), net.FProp(feed))
      with self.assertRaisesRegex(layers.keras_ops.KerasInputsError,
                                  r"missing \['token_ids'\], unknown "
                                  r"\['ids'\]"):
        net.FProp({'ids': x_ids, 'padding_mask': x_mask})
    # A list model takes them in model.inputs order, as Keras does.
    self.assertAllClose(list_model([x_ids, x_mask]), net.FProp(x_ids, x_mask))
    self.assertNotAllClose(net.FProp(x_ids, x_mask), net.FProp(x_mask, x_ids))
    dict_net = layers.SequentialLayer.Params().Set(
        name='net', layers=pipeline.FromKeras(dict_model)).Instantiate()
    with self.assertRaisesRegex(layers.keras_ops.KerasInputsError,
                                'takes a dict of inputs keyed by'):
      dict_net.FProp(x_mask, x_ids)
    with self.assertRaisesRegex(layers.keras_ops.KerasInputsError,
                                "'token_ids' is int32.*got float32"):
      dict_net.FProp({'token_ids': tf.cast(x_ids, tf.float32),
                      'padding_mask': x_mask})

  def testConstantPassedPositionallyGoesByKeyword(self):
    x, gate = keras.Input((3,)), keras.Input((3,))
    h = GatedSum(name='first')(x, None, gate)
    h = keras.layers.Dense(3, name='dense')(h)
    y = GatedSum(name='second')(h, x, gate)
    model = keras.Model([x, gate], keras.layers.Dense(2, name='out')(y))
    params = {p.name: p for p in pipeline.FromKeras(model)}
    self.assertEqual(params['first'].call_kwargs, {'first': None})
    self.assertEqual(params['first'].input_kwargs, {'gate': 1})
    self.assertEmpty(params['second'].call_kwargs)
    xs = (tf.random.stateless_normal([4, 3], [1, 1]),
          tf.random.stateless_normal([4, 3], [1, 2]))
    net = layers.SequentialLayer.Params().Set(
        name='net', layers=list(params.values())).Instantiate()
    pipeline.LoadKerasWeights(net, model)
    self.assertAllClose(net.FProp(*xs), model(list(xs)), atol=1e-6)

  def testTensorConstantKeywordIsHeldAsNumbers(self):
    # BLIP2's embeddings layer is called with visual_position_ids, a tensor
    # constant: Params hold it as numbers and the layer gets it back.
    x = keras.Input((3,))
    h = Shifted(name='shift')(x, offsets=tf.constant([1.0, 2.0, -3.0]))
    model = keras.Model(x, keras.layers.Dense(2, name='out')(h))
    params = {p.name: p for p in pipeline.FromKeras(model)}
    self.assertEqual(params['shift'].call_kwargs['offsets'], {'__array__': {
        'value': [1.0, 2.0, -3.0], 'dtype': 'float32'}})
    net = layers.SequentialLayer.Params().Set(
        name='net', layers=list(params.values())).Instantiate()
    pipeline.LoadKerasWeights(net, model)
    x = tf.random.stateless_normal([4, 3], [1, 3])
    self.assertAllClose(net.FProp(x), model(x), atol=1e-6)

  def testWhatIsStillRefusedIsNamed(self):
    inputs = keras.Input((4,))
    ids = keras.Input((5,), dtype='int32')
    masked = keras.layers.Embedding(10, 4, mask_zero=True, name='embed')(ids)
    inner = keras.Input((5, 4))
    block = keras.Model(inner, keras.layers.Dense(2)(inner), name='block')
    with self.assertRaisesRegex(pipeline.KerasModelError,
                                "nested model 'block' is called on .*masks"):
      pipeline.FromKeras(keras.Model(ids, block(masked)))
    with self.assertRaisesRegex(pipeline.KerasModelError,
                                'no layer or operation'):
      pipeline.FromKeras(keras.Model(inputs, inputs))
    with self.assertRaisesRegex(layers.keras_layer.UnsupportedKerasLayerError,
                                "'add.*5000 elements.*keras.Input"):
      pipeline.FromKeras(keras.Model(inputs,
                                     inputs + np.ones([1250, 4], 'f4')))
    # One output row whatever the batch (SAM's dense positional embedding):
    # a pipeline would return one copy per micro-batch.
    with self.assertRaisesRegex(pipeline.KerasModelError,
                                r'output 1 has shape \(1, 4\), not one row '
                                'per example'):
      pipeline.FromKeras(keras.Model(
          inputs, [keras.layers.Dense(2)(inputs), Table(name='table')(inputs)]))
    self.assertTrue(issubclass(pipeline.KerasModelError, errors.Error))

  def _HeavyOpDtypes(self, pipe, x, y):
    """The dtypes of every Conv2D and MatMul op of the traced step (its
    functions included)."""
    step = tf.function(lambda: pipe.ComputeLossAndGradients(x, y, _LossFn))
    graph = step.get_concrete_function().graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function
                                for n in f.node_def]
    return [tf.as_dtype(n.attr['T'].type).name for n in nodes
            if n.op in ('Conv2D', 'MatMul', 'BatchMatMulV2')]

  def testPipelinePrecisionComputesIn16Bits(self):
    model = _Cnn()
    x = tf.random.stateless_normal([4, 6, 6, 3], seed=[8, 1])
    y = tf.random.stateless_uniform([4], [8, 2], 0, 5, tf.int32)
    for policy, dtype in (('mixed_bfloat16', 'bfloat16'),
                          ('mixed_float16', 'float16')):
      with self.subTest(policy=policy):
        pipe = pipeline.PipeliningLayer.Params().Set(
            name='net', layers=pipeline.FromKeras(model), num_partitions=2,
            num_micro_batches=2, precision=policy).Instantiate()
        dtypes = self._HeavyOpDtypes(pipe, x, y)
        self.assertNotEmpty(dtypes)
        self.assertEqual(set(dtypes), {dtype})
        self.assertEqual({v.dtype for v in pipe.trainable_variables},
                         {tf.float32})

  def testKerasMixedPolicyWithBatchNorm(self):
    x = tf.random.stateless_normal([4, 6, 6, 3], seed=[9, 1])
    y = tf.random.stateless_uniform([4], [9, 2], 0, 5, tf.int32)
    keras.mixed_precision.set_dtype_policy('mixed_bfloat16')
    try:
      model = _Cnn()
    finally:
      keras.mixed_precision.set_dtype_policy('float32')
    _Randomize(model, seed=9)
    want_loss, want_grads = _KerasStep(model, x, y, 1)
    pipe = pipeline.PipeliningLayer.Params().Set(
        name='net', layers=pipeline.FromKeras(model), num_partitions=2,
        num_micro_batches=1).Instantiate()
    pairs = {id(a): b for a, b in pipeline.LoadKerasWeights(pipe, model)}
    self.assertEqual(set(self._HeavyOpDtypes(pipe, x, y)), {'bfloat16'})
    loss, _, grads = pipe.ComputeLossAndGradients(x, y, _LossFn)
    self.assertAllClose(want_loss, loss, rtol=1e-2)
    got = dict(zip(map(id, pipe.trainable_variables), grads))
    for var, g in zip(model.trainable_variables, want_grads):
      scale = float(tf.reduce_max(tf.abs(g)))
      self.assertAllClose(g, got[id(pairs[id(var)])], atol=2e-2 * scale,
                          rtol=0, msg=var.path)
    # Under another 16-bit precision than the model's own: a named error.
    pipe = pipeline.PipeliningLayer.Params().Set(
        name='net', layers=pipeline.FromKeras(model), num_partitions=2,
        precision='mixed_float16').Instantiate()
    with self.assertRaisesRegex(layers.keras_layer.KerasPrecisionError,
                                "'mixed_bfloat16'.*'mixed_float16'"):
      pipe.FProp(x)

  def testBatchNormWithoutScaleOrCenterReadingALaterTupleSlot(self):
    # ResNetV2's pre-activation BatchNormalization reads the block's input
    # beside its shortcut (the tuple's second slot); InceptionV3's has
    # scale=False.
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, padding='same', name='conv0')(inputs)
    s = keras.layers.MaxPooling2D(2, name='shortcut')(x)  # 3 x 3.
    h = keras.layers.BatchNormalization(scale=False, name='preact_bn')(x)
    h = keras.layers.Activation('relu', name='relu')(h)
    h = keras.layers.Conv2D(4, 3, 2, padding='same', name='conv1')(h)
    y = keras.layers.Add(name='add')([s, h])
    y = keras.layers.BatchNormalization(center=False, name='post_bn')(y)
    y = keras.layers.GlobalAveragePooling2D(name='pool')(y)
    model = keras.Model(inputs, keras.layers.Dense(5, name='logits')(y))
    _Randomize(model, seed=4)
    x = tf.random.stateless_normal([4, 6, 6, 3], seed=[4, 1])
    t = tf.random.stateless_normal([4, 5], seed=[4, 2])
    _, params = self._AssertSameStep(model, x, t)
    self.assertEqual(params[2].inputs, [1])  # preact_bn reads slot 1.
    self.assertEqual([w.name for w in model.get_layer('preact_bn').weights],
                     ['beta', 'moving_mean', 'moving_variance'])

  def testFloat64ModelWithBatchNormIsKerasToFloat64Rounding(self):
    # The zoo's truth (tools/keras_zoo/main.py): over a model built under Keras's
    # float64 policy the pipeline computes in float64, BatchNorm included,
    # so it equals Keras's float64 step far below float32 rounding. Only the
    # BatchNorm scale and offset (float32 variables here) round to float32.
    keras.config.set_dtype_policy('float64')
    try:
      model = _Cnn()
    finally:
      keras.config.set_dtype_policy('float32')
    _Randomize(model, seed=3)  # Then float32 values, as the zoo's twin has.
    model.set_weights([w.astype(np.float32) for w in model.get_weights()])
    # keras.Input is float32 (floatx) under any policy: float32 values.
    x = tf.cast(tf.random.stateless_normal([4, 6, 6, 3], [3, 1]), tf.float64)
    t = tf.random.stateless_normal([4, 5], [3, 2], dtype=tf.float64)

    _, want = keras_zoo.KerasStep(model, x, t, 2)
    _, _, got = keras_zoo.PipelineStep(model, pipeline.FromKeras(model), x, t,
                                       2, num_partitions=2, schedule='zb_h1')
    scale = max(float(tf.reduce_max(tf.abs(g))) for g in want)
    for var, g, h in zip(model.trainable_variables, want, got):
      tol = 1e-6 if '/bn' in var.path else 1e-13
      self.assertAllClose(g, tf.cast(h, tf.float64), rtol=0,
                          atol=tol * scale, msg=var.path)

  def testModelWithoutInputShapeIsRefused(self):
    with self.assertRaisesRegex(layers.keras_layer.KerasInputShapeError,
                                r'keras.Input\(shape=...\)'):
      pipeline.FromKeras(keras.Sequential([keras.layers.Dense(3)]))

  def testWeightsOfAnotherModelAreRefused(self):
    net = layers.SequentialLayer.Params().Set(
        name='net', layers=pipeline.FromKeras(_Cnn())).Instantiate()
    with self.assertRaisesRegex(layers.keras_layer.KerasWeightsError,
                                'do not match.*FromKeras'):
      pipeline.LoadKerasWeights(net, _Transformer(blocks=1))


if __name__ == '__main__':
  tf.test.main()
