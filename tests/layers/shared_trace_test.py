"""Tests for layers/shared_trace.py: one trace per kind of layer, same numbers."""

import tensorflow as tf

from gpipe_tf import layers
from gpipe_tf.layers import normalization
from gpipe_tf.layers import random_seeds
from gpipe_tf.layers import shared_run
from gpipe_tf.layers import shared_trace
from gpipe_tf.pipeline import PipeliningLayer


def Blocks(n, dropout=0.0):
  """n small Transformer blocks (also layers/shared_run_test.py's)."""
  return [layers.TransformerEncoderLayer.Params().Set(
      name=f'block{i}', model_dim=16, hidden_dim=32, num_heads=2,
      residual_dropout_prob=dropout, atten_dropout_prob=dropout)
          for i in range(n)]


def StepFn(net, inputs, seed=(5, 6), symbolic=False):
  """A tf.function: (loss, gradients of the first input and the
  variables) under a step seed, from a tape, or from tf.gradients if
  `symbolic` (a tape still watches, so that layers chain: a shared call's,
  or a run's, registered gradient)."""

  @tf.function
  def _Run():
    with random_seeds.StepSeedScope(tf.constant(seed, tf.int64)):
      with tf.GradientTape() as tape:
        tape.watch(inputs[0])
        y = net.FProp(*inputs, training=True)
        y = y[0] if isinstance(y, tuple) else y
        loss = tf.reduce_sum(tf.sin(y))
      wrt = [inputs[0]] + list(net.trainable_variables)
      if symbolic:
        return loss, tf.gradients(loss, wrt)
    return loss, tape.gradient(loss, wrt)
  return _Run


def _Step(net, inputs, seed=(5, 6)):
  """StepFn's result."""
  return StepFn(net, inputs, seed)()


class SharedTraceTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    shared_trace.Stats.Reset()

  def _Inputs(self):
    return (tf.random.stateless_normal([4, 5, 16], [1, 2]),
            tf.zeros([4, 5]))

  def testIdenticalBlocksShareOneTraceAndEqualTracingEach(self):
    net = layers.SequentialLayer.Params().Set(
        name='net', layers=Blocks(6)).Instantiate()
    shared = _Step(net, self._Inputs())
    stats = shared_trace.Stats.Get()
    # Two kinds: the first block, whose paddings input no tape watches (it
    # is traced without that input's gradient), and the five after it.
    # Tracing each block on its own (a kind keyed by its name, say) makes 6.
    self.assertEqual(stats.traces, 2)
    self.assertEqual(stats.calls, 6)
    with shared_trace.Off():
      alone = _Step(net, self._Inputs())
    self.assertEqual(shared_trace.Stats.Get().calls, 6)  # None under Off.
    self.assertAllClose(shared[0], alone[0], rtol=1e-6)
    for a, b in zip(shared[1], alone[1]):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-5)

  def testResetDropsTheFunctionsCalledWhole(self):
    """Stats.Reset() drops the traced kinds and the copies of their
    functions made to be called whole (which would otherwise hold every
    dropped kind's graphs for the process)."""
    net = layers.SequentialLayer.Params().Set(
        name='net', layers=Blocks(2)).Instantiate()
    with shared_run.NoRuns(), shared_trace.CallsKeptWhole():
      _Step(net, self._Inputs())
    self.assertNotEmpty(shared_trace._WHOLE_OF)  # pylint: disable=protected-access
    shared_trace.Stats.Reset()
    self.assertEmpty(shared_trace._WHOLE_OF)  # pylint: disable=protected-access

  def testDropoutMasksAreEachLayersOwn(self):
    """A shared trace takes each layer's seed: the masks (and so the loss
    and gradients) equal those of every layer traced on its own, and two
    layers of one kind draw different masks."""
    net = layers.SequentialLayer.Params().Set(
        name='net', layers=Blocks(3, dropout=0.5)).Instantiate()
    shared = _Step(net, self._Inputs())
    self.assertEqual(shared_trace.Stats.Get().traces, 2)
    with shared_trace.Off():
      alone = _Step(net, self._Inputs())
    self.assertAllClose(shared[0], alone[0], rtol=1e-6)
    for a, b in zip(shared[1], alone[1]):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-5)
    with shared_trace.Off():
      other = _Step(net, self._Inputs(), seed=(7, 8))
    self.assertNotAllClose(shared[0], other[0])

  def testKindsSplitByShapeAndUnshareableLayersTraceAlone(self):
    fc = lambda i, d_in, d_out: layers.FCLayer.Params().Set(
        name=f'fc{i}', input_dim=d_in, output_dim=d_out)
    net = layers.SequentialLayer.Params().Set(name='net', layers=[
        fc(0, 8, 8), fc(1, 8, 8), fc(2, 8, 16), fc(3, 16, 16),
        normalization.BatchNormLayer.Params().Set(name='bn', dim=16),
        fc(4, 16, 16)]).Instantiate()
    x = tf.random.stateless_normal([4, 8], [3, 4])
    _Step(net, (x,))
    stats = shared_trace.Stats.Get()
    # Kinds: 8->8 (fc0, fc1), 8->16 (fc2), 16->16 (fc3, fc4); BatchNorm has
    # moving statistics and is traced as written.
    self.assertEqual((stats.traces, stats.calls), (3, 5))

  def testOutsideAFunctionNothingIsShared(self):
    net = layers.SequentialLayer.Params().Set(
        name='net', layers=Blocks(2)).Instantiate()
    with random_seeds.StepSeedScope(tf.constant([1, 2], tf.int64)):
      net.FProp(*self._Inputs(), training=True)
    self.assertEqual(shared_trace.Stats.Get().calls, 0)

  def testWeightGradientsAreAFunctionOfTheirOwn(self):
    """Zero-bubble's W runs apart from B: each kind's weight gradients are a
    function of their own, called once per layer in the backward."""
    net = layers.SequentialLayer.Params().Set(
        name='net', layers=Blocks(3)).Instantiate()

    @tf.function
    def _Run():
      with random_seeds.StepSeedScope(tf.constant([1, 2], tf.int64)):
        with tf.GradientTape() as tape:
          y = net.FProp(*self._Inputs(), training=True)[0]
          loss = tf.reduce_sum(y)
      return tape.gradient(loss, net.trainable_variables)
    with shared_run.NoRuns():  # Each layer a call (not blocks 2-3 a loop).
      graph = _Run.get_concrete_function().graph
    kinds = [k for k in shared_trace._KINDS.values() if k is not None]  # pylint: disable=protected-access
    called = [op.get_attr('f').name for op in graph.get_operations()
              if op.type in ('PartitionedCall', 'StatefulPartitionedCall')]
    # The first block's input gradient is wanted by nobody: its W
    # differentiates it whole and it has no B.
    for piece, calls in (('forward', 3), ('backward', 2), ('weights', 3)):
      names = [tf.compat.as_str(getattr(k, piece).name) for k in kinds
               if getattr(k, piece) is not None]
      self.assertEqual(sum(called.count(n) for n in names), calls, piece)

  def testPipelineCellsShareTracesAndEqualTheSequentialLayer(self):
    """A pipeline's cells share their layers' traces (one kind for the
    blocks of every cell) and equal the SequentialLayer traced layer by
    layer."""
    blocks = Blocks(4)
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=blocks, num_partitions=2, num_micro_batches=2,
        balance=[2, 2]).Instantiate()
    seq = layers.SequentialLayer.Params().Set(
        name='net', layers=blocks).Instantiate()
    got = _Step(pipe, self._Inputs())
    self.assertGreater(shared_trace.Stats.Get().calls, 0)
    self.assertLessEqual(shared_trace.Stats.Get().traces, 3)
    with shared_trace.Off():
      want = _Step(seq, self._Inputs())
    self.assertAllClose(got[0], want[0], rtol=1e-5)
    for a, b in zip(got[1][1:], want[1][1:]):
      self.assertAllClose(a, b, rtol=1e-4, atol=1e-5)


if __name__ == '__main__':
  tf.test.main()
