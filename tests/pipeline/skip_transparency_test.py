"""Skips in a pipeline: a U-Net's stashed tensors go straight from the stashing cell to the popping cell, and the step equals SequentialLayer's.

The model (15 layers, K=4, balance [4, 4, 4, 3]) has four skips: 's1' from
cell 0 to cell 3 around 's2' from cell 0 to cell 2 (two nested long skips),
's3' inside cell 1 (stays local) and 's4' from cell 2 to cell 3 (the next
cell). Every schedule (gpipe, 1f1b, interleaved_1f1b and zb_h1 at V=1 or 2,
zbv, dualpipe_v), every execution and every remat policy are covered, not as
their full product.
"""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.layers import random_seeds
from gpipe_tf.layers import skips
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import transfers

_SEED = [3, 4]
_BALANCE = [4, 4, 4, 3]


def _Fc(name, din, dout):
  return core.FCLayer.Params().Set(name=name, input_dim=din, output_dim=dout,
                                   activation='TANH')


def UNetLayers():
  """An encoder that stashes, a decoder that pops: skips 's1' (cell 0 -> 3)
  around 's2' (cell 0 -> 2, concatenated), 's3' (inside cell 1) and 's4'
  (cell 2 -> 3) at balance [4, 4, 4, 3]."""
  branch, merge = core.BranchLayer.Params, core.MergeLayer.Params
  return [
      _Fc('e0', 6, 8), branch().Set(name='b1', stash=('s1',)),
      _Fc('e1', 8, 8), branch().Set(name='b2', stash=('s2',)),
      # cell 1
      _Fc('e2', 8, 8), branch().Set(name='b3', stash=('s3',)),
      _Fc('e3', 8, 8), merge().Set(name='m3', pop=('s3',)),
      # cell 2
      _Fc('d2', 8, 8), merge().Set(name='m2', pop=('s2',), op='concat'),
      _Fc('d1', 16, 8), branch().Set(name='b4', stash=('s4',)),
      # cell 3
      merge().Set(name='m4', pop=('s4',)), merge().Set(name='m1', pop=('s1',)),
      _Fc('logits', 8, 5)]


class _Identity(base_layer.BaseLayer):
  """Returns its inputs: with pop and stash, a skip passed on unchanged
  (what FromKeras makes of a tensor read at several places)."""

  def FProp(self, *inputs, training=False):
    return core.FromTuple(tuple(inputs))

  @classmethod
  def FPropMeta(cls, p, *shapes):
    return base_layer.LayerMeta(0, tuple(tuple(s) for s in shapes), 0)


def _LossFn(logits, labels):
  per_example = losses.SoftmaxCrossEntropy(logits, labels)
  return loss_lib.LossTerms(per_example, 1.0 + tf.cast(labels, tf.float32))


def _Data(n=8):
  x = tf.random.stateless_normal([n, 6], seed=[1, 2])
  y = tf.random.stateless_uniform([n], [5, 6], 0, 5, tf.int32)
  return x, y


def _Pipe(schedule='gpipe', v=1, m=4, execution='loop', remat='never'):
  return PipeliningLayer.Params().Set(
      name='net', layers=UNetLayers(), num_partitions=4, num_micro_batches=m,
      schedule=schedule, num_virtual_stages=v, execution=execution,
      remat=remat, balance=_BALANCE if v == 1 else None).Instantiate()


class SkipsTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.x, cls.y = _Data()
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=UNetLayers()).Instantiate()
    with random_seeds.StepSeedScope(tf.constant(_SEED, tf.int64)):
      with tf.GradientTape(persistent=True) as tape:
        tape.watch(cls.x)
        cls.want_out = seq.FProp(cls.x, training=True)
        cls.want_loss = loss_lib.ReduceTerms(_LossFn(cls.want_out, cls.y))[0]
        cls.want_sum = tf.reduce_sum(cls.want_out * tf.range(5.0))
    cls.want_grads = tape.gradient(cls.want_loss, seq.trainable_variables)
    cls.want_dsum = tape.gradient(cls.want_sum,
                                  [cls.x] + list(seq.trainable_variables))

  def _AssertAllClose(self, want, got):
    self.assertLen(got, len(want))
    for a, b in zip(want, got):
      self.assertIsNotNone(b)
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testCellsKnowOnlyTheSkipsThatCrossThem(self):
    pipe = _Pipe()
    self.assertEqual(pipe.balance, _BALANCE)
    self.assertEqual([(c.skip_in, c.skip_out) for c in pipe.cells],
                     [((), ('s1', 's2')), ((), ()), (('s2',), ('s4',)),
                      (('s1', 's4'), ())])

  def testEveryScheduleExecutionAndRematEqualsSequential(self):
    # Each schedule once; each execution and each remat policy at least
    # once ('folded', 'switch' and every remat twice), long skips through
    # V-shaped and interleaved placements. testTapePathEqualsSequential runs
    # 'loop', 'switch' and 'unrolled' again, on the tape path.
    cases = [('gpipe', 1, 4, 'loop', 'always'),
             ('1f1b', 1, 4, 'folded', 'except_last'),
             ('interleaved_1f1b', 2, 4, 'switch', 'never'),
             ('zb_h1', 1, 4, 'unrolled', 'always'),
             ('zbv', 2, 4, 'folded', 'never'),
             ('dualpipe_v', 2, 8, 'switch', 'except_last')]
    for schedule, v, m, execution, remat in cases:
      with self.subTest(schedule=schedule, execution=execution, remat=remat):
        pipe = _Pipe(schedule, v, m, execution, remat)
        self.assertTrue(any(c.skip_in for c in pipe.cells))
        with random_seeds.StepSeedScope(tf.constant(_SEED, tf.int64)):
          loss, _, grads = pipe.ComputeLossAndGradients(
              self.x, self.y, _LossFn, pipe.trainable_variables)
        self.assertAllClose(self.want_loss, loss, rtol=1e-5, atol=1e-6)
        self._AssertAllClose(self.want_grads, grads)

  def testTapePathEqualsSequential(self):
    # Outputs, input gradients and weight gradients of FProp under a tape,
    # and inference.
    for execution, remat in (('loop', 'always'), ('switch', 'never'),
                             ('unrolled', 'except_last')):
      with self.subTest(execution=execution, remat=remat):
        pipe = _Pipe('gpipe', execution=execution, remat=remat)
        x = tf.identity(self.x)
        with random_seeds.StepSeedScope(tf.constant(_SEED, tf.int64)):
          with tf.GradientTape() as tape:
            tape.watch(x)
            out = pipe.FProp(x, training=True)
            total = tf.reduce_sum(out * tf.range(5.0))
        self.assertAllClose(self.want_out, out, rtol=1e-5, atol=1e-6)
        self._AssertAllClose(
            self.want_dsum,
            tape.gradient(total, [x] + list(pipe.trainable_variables)))
        self.assertAllClose(self.want_out, pipe.FProp(self.x),
                            rtol=1e-5, atol=1e-6)

  def testSkipGoesStraightToItsReaderOncePerMicroBatch(self):
    # Read off the unrolled step graph: which device reads which tensors
    # from which. A skip routed through the cells in between would show as
    # more [2, 8] tensors into devices 1 and 2 and none from 0 into 3.
    pipe = _Pipe('1f1b', execution='unrolled', remat='always')
    step = tf.function(lambda: pipe.ComputeLossAndGradients(
        self.x, self.y, _LossFn, pipe.trainable_variables))
    pairs = transfers.ByPair(step.get_concrete_function().graph)
    m, mb = 4, [(2, 8)]
    self.assertEqual(
        {(int(a[-1]), int(b[-1])): shapes for (a, b), shapes in pairs.items()},
        {(0, 1): mb * m, (1, 2): mb * m, (2, 3): mb * 2 * m,  # y; y + s4
         (0, 2): mb * m, (0, 3): mb * m,                      # s2, s1
         (3, 2): mb * 2 * m, (2, 1): mb * m, (1, 0): mb * m,  # dx; dx + ds4
         (2, 0): mb * m, (3, 0): mb * m})                     # ds2, ds1

  def testSkipPoppedAndStashedAgainUnchanged(self):
    # Cell 1 pops 's' and stashes the same tensor as 't' for cell 3: its
    # program's skip_out is its skip_in placeholder.
    layers = [_Fc('a', 6, 8),
              core.BranchLayer.Params().Set(name='b', stash=('s',)),
              _Fc('c', 8, 8),
              _Identity.Params().Set(name='i', pop=('s',), stash=('t',)),
              _Fc('d', 8, 8), _Fc('e', 8, 8),
              core.MergeLayer.Params().Set(name='m', pop=('t',)),
              _Fc('logits', 8, 5)]
    seq = core.SequentialLayer.Params().Set(name='net',
                                            layers=layers).Instantiate()
    with tf.GradientTape() as tape:
      want_loss = loss_lib.ReduceTerms(
          _LossFn(seq.FProp(self.x, training=True), self.y))[0]
    want = tape.gradient(want_loss, seq.trainable_variables)
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=layers, num_partitions=4, num_micro_batches=4,
        schedule='1f1b', remat='always', balance=[2, 2, 2, 2]).Instantiate()
    self.assertEqual([(c.skip_in, c.skip_out) for c in pipe.cells],
                     [((), ('s',)), (('s',), ('t',)), ((), ()),
                      (('t',), ())])
    loss, _, grads = pipe.ComputeLossAndGradients(
        self.x, self.y, _LossFn, pipe.trainable_variables)
    self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
    self._AssertAllClose(want, grads)

  def testNamedErrors(self):
    layers = UNetLayers()
    with self.assertRaisesRegex(skips.StashNeverPoppedError, "'s1' by"):
      PipeliningLayer.Params().Set(
          name='net', layers=layers[:13] + layers[14:], num_partitions=4,
          balance=[4, 4, 4, 2]).Instantiate()
    with self.assertRaisesRegex(skips.PopWithoutStashError, "layer 6 'm3'"):
      PipeliningLayer.Params().Set(
          name='net', layers=layers[:5] + layers[6:], num_partitions=4,
          balance=[4, 4, 4, 2]).Instantiate()


if __name__ == '__main__':
  tf.test.main()
