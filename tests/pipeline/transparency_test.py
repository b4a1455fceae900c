"""Keystone: a PipeliningLayer computes what SequentialLayer computes, outputs and gradients."""

import itertools

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.pipeline import PipeliningLayer


class _PairLayer(base_layer.BaseLayer):
  """Takes and returns (x, gate, ids): a float side input and an int passenger."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 0, 'Width of x.')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    self.CreateVariable('w', [self.p.dim, self.p.dim])

  def FProp(self, x, gate, ids, training=False):
    y = tf.tanh(tf.matmul(x, self.w)) * gate + tf.cast(ids, x.dtype)[:, None]
    return y, gate * 0.5, ids

  @classmethod
  def FPropMeta(cls, p, x, gate, ids):
    return base_layer.LayerMeta(2 * p.dim * p.dim, (x, gate, ids), p.dim**2)


class _DropPair(base_layer.BaseLayer):
  """Drops the side inputs: (x, gate, ids) -> x."""

  def FProp(self, x, gate, ids, training=False):
    return x

  @classmethod
  def FPropMeta(cls, p, x, gate, ids):
    return base_layer.LayerMeta(0, (x,), 0)


_Fc = test_utils.FcParams
_MlpLayers = test_utils.MlpLayers


def _Build(cls_params, layers, **kw):
  return cls_params.Set(name='net', layers=layers, **kw).Instantiate()


class TransparencyTest(tf.test.TestCase):

  def _LossAndGrads(self, model, inputs, eager):

    def _Step(*xs):
      with tf.GradientTape() as tape:
        tape.watch([x for x in xs if x.dtype.is_floating])
        y = model.FProp(*xs, training=True)
        # A loss that weighs every example differently, so a permuted or
        # dropped example would show.
        w = tf.range(1, tf.shape(y)[0] + 1, dtype=y.dtype)[:, None]
        loss = tf.reduce_sum(tf.sin(y) * w)
      sources = list(model.trainable_variables) + [
          x for x in xs if x.dtype.is_floating]
      return y, tape.gradient(loss, sources)

    fn = _Step if eager else tf.function(_Step)
    return fn(*inputs)

  def _AssertTransparent(self, layers, inputs, k, m, remat, eager=False,
                         **pipe_kw):
    seq = _Build(core.SequentialLayer.Params(), layers)
    pipe = _Build(PipeliningLayer.Params(), layers, num_partitions=k,
                  num_micro_batches=m, remat=remat, **pipe_kw)
    self.assertEqual(len(pipe.balance), k)
    # Same variable paths give the same initial values.
    for a, b in zip(seq.trainable_variables, pipe.trainable_variables):
      self.assertEqual(a.name, b.name)
      self.assertAllEqual(a, b)
    y1, g1 = self._LossAndGrads(seq, inputs, eager=True)
    y2, g2 = self._LossAndGrads(pipe, inputs, eager=eager)
    self.assertAllClose(y1, y2, rtol=1e-5, atol=1e-6)
    self.assertLen(g2, len(g1))
    for a, b in zip(g1, g2):
      self.assertIsNotNone(b)
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testFullGridEager(self):
    x = tf.random.stateless_normal([11, 6], seed=[1, 2])
    # M=1, uneven micro-batches (11 examples as 4, 4, 3), and M > K (8).
    # Every K x M cell runs, with one remat each in a Latin square (remat
    # i + j at K number i, M number j): every (K, remat) and (M, remat) pair
    # runs too, in 9 cells instead of 27.
    remats = ('always', 'except_last', 'never')
    for (i, k), (j, m) in itertools.product(enumerate((1, 2, 4)),
                                            enumerate((1, 3, 8))):
      remat = remats[(i + j) % 3]
      with self.subTest(k=k, m=m, remat=remat):
        self._AssertTransparent(_MlpLayers(), (x,), k, m, remat, eager=True)

  def testInFunction(self):
    # The graph path (explicit control dependencies, custom gradient inside a
    # tf.function) on a subset of the grid; tracing every cell costs seconds:
    # every K, every remat, M=1, M > K and uneven micro-batches, once each
    # (testFullGridEager runs every K x M cell; its Latin square, every
    # (K, remat) pair).
    x = tf.random.stateless_normal([11, 6], seed=[1, 2])
    for k, m, remat in [(1, 2, 'always'), (2, 8, 'except_last'),
                        (4, 3, 'always'), (2, 1, 'never')]:
      with self.subTest(k=k, m=m, remat=remat):
        self._AssertTransparent(_MlpLayers(), (x,), k, m, remat)

  def testTupleActivationsAndIntPassengers(self):
    layers = [_PairLayer.Params().Set(name=f'pair{i}', dim=4)
              for i in range(5)] + [_DropPair.Params().Set(name='drop')]
    x = tf.random.stateless_normal([9, 4], seed=[5, 6])
    gate = tf.random.stateless_uniform([9, 1], seed=[7, 8])
    ids = tf.range(9, dtype=tf.int32) % 3
    for remat in ('always', 'never'):
      with self.subTest(remat=remat):
        self._AssertTransparent(
            layers, (x, gate, ids), 3, 4, remat,
            input_shapes=[(None, 4), (None, 1), (None,)])

  def testAnOutputTheLossIgnores(self):
    # The loss reads only y of (y, gate, ids): TensorFlow hands the
    # pipeline's custom gradient zeros for gate, not None, and
    # interpreter.FeedOutputGradients relies on it.
    layers = [_PairLayer.Params().Set(name=f'pair{i}', dim=4)
              for i in range(4)]
    x = tf.random.stateless_normal([8, 4], seed=[5, 6])
    gate = tf.random.stateless_uniform([8, 1], seed=[7, 8])
    ids = tf.range(8, dtype=tf.int32) % 3

    def _Grads(model):
      with tf.GradientTape() as tape:
        tape.watch([x, gate])
        y, _, _ = model.FProp(x, gate, ids, training=True)
        loss = tf.reduce_sum(tf.sin(y))
      return tape.gradient(loss, list(model.trainable_variables) + [x, gate])

    want = _Grads(_Build(core.SequentialLayer.Params(), layers))
    pipe = _Build(PipeliningLayer.Params(), layers, num_partitions=2,
                  num_micro_batches=4, balance=[2, 2])
    for name, fn in (('eager', _Grads), ('function', tf.function(_Grads))):
      with self.subTest(name):
        got = fn(pipe)
        self.assertLen(got, len(want))
        for a, b in zip(want, got):
          self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testUnknownBatchSize(self):
    seq = _Build(core.SequentialLayer.Params(), _MlpLayers())
    pipe = _Build(PipeliningLayer.Params(), _MlpLayers(), num_partitions=2,
                  num_micro_batches=4)

    @tf.function(input_signature=[tf.TensorSpec([None, 6])])
    def _Grads(x):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(pipe.FProp(x, training=True)))
      return tape.gradient(loss, pipe.trainable_variables)

    x = tf.random.stateless_normal([10, 6], seed=[9, 9])
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(seq.FProp(x, training=True)))
    want = tape.gradient(loss, seq.trainable_variables)
    for a, b in zip(want, _Grads(x)):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testOneOptimizerStepMatches(self):
    """One synchronous update per mini-batch: weights after a step agree."""
    x = tf.random.stateless_normal([12, 6], seed=[2, 3])
    models = [_Build(core.SequentialLayer.Params(), _MlpLayers()),
              _Build(PipeliningLayer.Params(), _MlpLayers(), num_partitions=4,
                     num_micro_batches=6)]
    for model in models:
      opt = tf.keras.optimizers.SGD(0.1)
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model.FProp(x, training=True)))
      opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                              model.trainable_variables))
    for a, b in zip(*(m.trainable_variables for m in models)):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)
    # The step changed the weights (the comparison above is not vacuous).
    fresh = _Build(core.SequentialLayer.Params(), _MlpLayers())
    self.assertNotAllClose(fresh.trainable_variables[0],
                           models[1].trainable_variables[0])

  def testDropoutMasksSurviveRecompute(self):
    """Recomputed forwards redraw the same dropout masks as the first forward."""
    layers = []
    for i in range(4):
      layers += [_Fc(i, 8, 8),
                 core.DropoutLayer.Params().Set(name=f'drop{i}', keep_prob=0.5)]
    x = tf.random.stateless_normal([8, 8], seed=[4, 4])
    results = []
    for remat in ('always', 'never'):
      pipe = _Build(PipeliningLayer.Params(), layers, num_partitions=2,
                    num_micro_batches=4, remat=remat)
      from gpipe_tf.layers import random_seeds  # pylint: disable=g-import-not-at-top

      @tf.function
      def _Step(pipe=pipe):
        with random_seeds.StepSeedScope(tf.constant([7, 7], tf.int64)):
          with tf.GradientTape() as tape:
            y = pipe.FProp(x, training=True)
            loss = tf.reduce_sum(tf.sin(y))
        return y, tape.gradient(loss, pipe.trainable_variables)

      results.append(_Step())
    (y1, g1), (y2, g2) = results
    self.assertAllClose(y1, y2)
    # Masks really drop something.
    self.assertGreater(int(tf.reduce_sum(tf.cast(y1 == 0.0, tf.int32))), 0)
    for a, b in zip(g1, g2):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testEvalModeMatchesAndHasNoCustomGradient(self):
    x = tf.random.stateless_normal([10, 6], seed=[8, 1])
    seq = _Build(core.SequentialLayer.Params(), _MlpLayers())
    pipe = _Build(PipeliningLayer.Params(), _MlpLayers(), num_partitions=2,
                  num_micro_batches=5)
    self.assertAllClose(seq.FProp(x), pipe.FProp(x), rtol=1e-5, atol=1e-6)
    graph = tf.function(lambda: pipe.FProp(x)).get_concrete_function().graph
    ops = {op.type for op in graph.get_operations()}
    self.assertNotIn('IdentityN', ops)  # No custom-gradient op in eval mode.
    self.assertFalse(any('bwd' in op.name for op in graph.get_operations()))


if __name__ == '__main__':
  tf.test.main()
