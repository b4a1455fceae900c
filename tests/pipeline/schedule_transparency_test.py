"""Keystone for every schedule: the loss inside the pipeline gives SequentialLayer's loss and gradients.

For 'gpipe', '1f1b', 'interleaved_1f1b' (2 virtual stages) and 'zb_h1', every
remat policy and every (K, M) in {(1, 2), (2, 1), (2, 3), (4, 4)} (each pair of
the three once):
``PipeliningLayer.ComputeLossAndGradients`` equals the mean loss of a
SequentialLayer over the same layers on the whole mini-batch, and its
gradients. Layers whose forward depends on the micro-batch split (BatchNorm
with batch statistics, dropout) are compared with the GradientTape path of the
same K and M: the schedule changes the order of the work, never its result.
"""

import functools
import itertools

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.layers import normalization
from gpipe_tf.layers import random_seeds
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import loss as loss_lib

SCHEDULES = (('gpipe', 1), ('1f1b', 1), ('interleaved_1f1b', 2), ('zb_h1', 1))
REMATS = ('always', 'except_last', 'never')
_SEED = [3, 4]


_Fc = test_utils.FcParams
_MlpLayers = test_utils.MlpLayers


def _BatchNormLayers(moving_avg):
  layers = []
  for i in range(8):
    layers.append(_Fc(i, 6 if i == 0 else 8, 8 if i < 7 else 5, 'NONE'))
    if i % 2 == 0:
      layers.append(normalization.BatchNormLayer.Params().Set(
          name=f'bn{i}', dim=8, use_moving_avg_in_training=moving_avg,
          decay=0.5))
  return layers


def _DropoutLayers():
  layers = []
  for i in range(8):
    layers.append(_Fc(i, 6 if i == 0 else 8, 8 if i < 7 else 5))
    layers.append(core.DropoutLayer.Params().Set(name=f'drop{i}',
                                                 keep_prob=0.7))
  return layers[:-1]


def _LossFn(logits, labels):
  per_example = losses.SoftmaxCrossEntropy(logits, labels)
  # Uneven weights: a permuted or dropped example would show.
  weights = 1.0 + tf.cast(labels, tf.float32)
  return loss_lib.LossTerms(per_example, weights, {
      'accuracy': tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                                   labels), tf.float32)})


def _Data(n=11):
  x = tf.random.stateless_normal([n, 6], seed=[1, 2])
  y = tf.random.stateless_uniform([n], [5, 6], 0, 5, tf.int32)
  return x, y


def _Pipe(layers, k, m, remat, schedule='gpipe', v=1, execution='loop',
          **kw):
  return PipeliningLayer.Params().Set(
      name='net', layers=layers, num_partitions=k, num_micro_batches=m,
      remat=remat, schedule=schedule, num_virtual_stages=v,
      execution=execution, **kw).Instantiate()


def _TapeLossAndGrads(model, x, y):
  """The reference: the whole mini-batch's loss after the model, a tape."""
  with random_seeds.StepSeedScope(tf.constant(_SEED, tf.int64)):
    with tf.GradientTape() as tape:
      loss, metrics = loss_lib.ReduceTerms(
          _LossFn(model.FProp(x, training=True), y))
  return loss, metrics, tape.gradient(loss, model.trainable_variables)


_SPLIT_LAYERS = {'batch_stats': lambda: _BatchNormLayers(False),
                 'dropout': _DropoutLayers}


@functools.lru_cache(maxsize=None)
def _SplitReference(kind):
  """(reference pipe, its tape (loss, metrics, grads)) of the GPipe tape path
  at K=2, M=3 on _Data(12), layers _SPLIT_LAYERS[kind]: run once, shared by
  the tests below (the pipe keeps its state after that one step)."""
  x, y = _Data(12)
  ref = _Pipe(_SPLIT_LAYERS[kind](), 2, 3, 'always')
  return ref, _TapeLossAndGrads(ref, x, y)


def _InsideLossAndGrads(pipe, x, y):
  with random_seeds.StepSeedScope(tf.constant(_SEED, tf.int64)):
    return pipe.ComputeLossAndGradients(x, y, _LossFn)


def AssertSameLossAndGrads(test, want, got):
  """(loss, metrics, grads) `got` equals `want` (rtol 1e-5), every gradient
  present."""
  (l1, m1, g1), (l2, m2, g2) = want, got
  test.assertAllClose(l1, l2, rtol=1e-5, atol=1e-6)
  test.assertAllClose(m1['accuracy'], m2['accuracy'], rtol=1e-5)
  test.assertLen(g2, len(g1))
  for a, b in zip(g1, g2):
    test.assertIsNotNone(b)
    test.assertAllClose(a, b, rtol=1e-5, atol=1e-6)


class ScheduleTransparencyTest(tf.test.TestCase):

  def _AssertSame(self, want, got):
    AssertSameLossAndGrads(self, want, got)

  def testFullGridEager(self):
    x, y = _Data()
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=_MlpLayers()).Instantiate()
    want = _TapeLossAndGrads(seq, x, y)
    # K x M pairs that cover one device, uneven and even splits, M > K and
    # M = K at K=4 (N=11: 3, 3, 3, 2; M=8 there cost twice the CPU and
    # claimed nothing more); support_test and precision_test cover the
    # features on top. Every pair of (schedule, remat, K x M) values runs (a
    # Latin square, 16 cells, not the 48 of the full product): schedule i at
    # pair j takes remat i + j,
    # so each schedule meets every remat and every K x M, and each remat
    # every K x M; testInFunction and the rows below add the graph path.
    for (i, (name, v)), (j, (k, m)) in itertools.product(
        enumerate(SCHEDULES), enumerate(((1, 2), (2, 1), (2, 3), (4, 4)))):
      remat = REMATS[(i + j) % len(REMATS)]
      with self.subTest(schedule=name, remat=remat, k=k, m=m):
        pipe = _Pipe(_MlpLayers(), k, m, remat, name, v)
        self._AssertSame(want, _InsideLossAndGrads(pipe, x, y))

  def testInFunction(self):
    # The graph path pins every device's order with control dependencies and
    # defers zb_h1's weight-gradient ops; here at K=4 (tracing costs: two
    # schedules, remat 'always'). Every schedule's graph path at K=2, M=3
    # (built whole, as 'loop' builds steps this small) is
    # testUnrolledExecution's, every remat among them, and
    # testLoopWithoutBudgetRunsAsOneSwitchLoop's; folded at K=2, M=8,
    # support_test.testEveryScheduleFolded's.
    x, y = _Data()
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=_MlpLayers()).Instantiate()
    want = _TapeLossAndGrads(seq, x, y)
    for name, v in (SCHEDULES[1], SCHEDULES[3]):
      with self.subTest(schedule=name):
        pipe = _Pipe(_MlpLayers(), 4, 4, 'always', name, v)
        got = tf.function(lambda p=pipe: _InsideLossAndGrads(p, x, y))()
        self._AssertSame(want, got)

  def testBatchNormMovingAverageRows(self):
    # Normalising with the moving statistics makes the forward independent of
    # the split: equal to SequentialLayer for every schedule and remat.
    # Eagerly, each schedule once, every remat among them; with
    # support_test's moving-average BatchNorm (bn1, graph path, every feature
    # at once: testEveryCell's 'tape' and 'loss inside' columns and
    # testEveryScheduleFolded) every (schedule, remat) pair runs. Its pairs
    # for these four schedules: gpipe never/except_last, 1f1b never/always,
    # interleaved_1f1b except_last/never, zb_h1 always/except_last; these
    # cells are the other four.
    x, y = _Data()
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=_BatchNormLayers(True)).Instantiate()
    want = _TapeLossAndGrads(seq, x, y)
    for (name, v), remat in zip(
        SCHEDULES, ('always', 'except_last', 'always', 'never')):
      with self.subTest(schedule=name, remat=remat):
        pipe = _Pipe(_BatchNormLayers(True), 2, 4, remat, name, v)
        self._AssertSame(want, _InsideLossAndGrads(pipe, x, y))

  def testSplitDependentRowsEqualTheTapePath(self):
    # Batch statistics per micro-batch and dropout masks per micro-batch: every
    # schedule equals the GPipe GradientTape path of the same K and M. Every
    # pair of (layers, schedule, remat) values runs: each schedule once per
    # layer kind, with the other remat for the other kind (8 cells, not 16).
    # With batch statistics, the moving statistics move once per step, from
    # every micro-batch, as the reference's (they moved away from their
    # initial 1). Every schedule with remat 'always' and the moving
    # statistics compared is also support_test's (_AssertSameState; 1f1b
    # folded, zb_h1 in the loop).
    x, y = _Data(12)
    for l, kind in enumerate(('batch_stats', 'dropout')):
      ref, want = _SplitReference(kind)
      for i, (name, v) in enumerate(SCHEDULES):
        remat = ('always', 'never')[(i + l) % 2]
        with self.subTest(layers=kind, schedule=name, remat=remat):
          pipe = _Pipe(_SPLIT_LAYERS[kind](), 2, 3, remat, name, v)
          self._AssertSame(want, _InsideLossAndGrads(pipe, x, y))
          if kind == 'batch_stats':
            self._AssertMovedOnce(ref, pipe)

  def _AssertMovedOnce(self, ref, pipe):
    moving = [(a, b) for a, b in zip(ref.variables, pipe.variables)
              if 'moving' in a.name]
    self.assertNotEmpty(moving)
    for a, b in moving:
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)
      if 'moving_variance' in a.name:  # Moved away from its initial 1.
        self.assertNotAllClose(b, tf.ones_like(b))

  def testUnrolledExecution(self):
    # The same interpreter without the loop: same numbers. The
    # graph shows which execution ran (no While op when unrolled). Each
    # schedule traced with one remat, every remat among them (as
    # support_test.testEveryCell's 'unrolled' cells, remat by a Latin square).
    x, y = _Data(12)
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=_MlpLayers()).Instantiate()
    want = _TapeLossAndGrads(seq, x, y)
    for (name, v), remat in zip(SCHEDULES,
                                itertools.cycle(REMATS)):
      with self.subTest(schedule=name, remat=remat):
        pipe = _Pipe(_MlpLayers(), 2, 3, remat, name, v, 'unrolled')
        step = tf.function(lambda p=pipe: _InsideLossAndGrads(p, x, y))
        ops = {op.type for op in step.get_concrete_function().graph
               .get_operations()}
        self.assertNotIn('While', ops)
        self._AssertSame(want, step())
    # Eagerly, steps this small build whole under 'loop' too (periods.Plan:
    # the same one STATIC segment as 'unrolled', and the execution changes
    # nothing else), so the eager rows with batch statistics, dropout and
    # moving averages are testSplitDependentRowsEqualTheTapePath's and
    # testBatchNormMovingAverageRows'. Unrolled graphs with all three kinds
    # at once: support_test.testEveryCell's 'unrolled' cells (gpipe V=2
    # 'tape', 1f1b and zbv 'loss inside', and inference).

  def testLoopWithoutBudgetRunsAsOneSwitchLoop(self):
    # No tick may be built on its own: one while loop, a tf.switch_case per
    # stage and tick picking the step; the same with execution='switch'.
    x, y = _Data(12)
    want = _TapeLossAndGrads(core.SequentialLayer.Params().Set(
        name='net', layers=_MlpLayers()).Instantiate(), x, y)
    for (name, v), how in zip(SCHEDULES, itertools.cycle((
        dict(loop_budget=0), dict(execution='switch')))):
      with self.subTest(schedule=name, how=repr(how)):
        pipe = _Pipe(_MlpLayers(), 2, 3, 'always', name, v, **how)
        step = tf.function(lambda p=pipe: _InsideLossAndGrads(p, x, y))
        ops = [op.type for op in
               step.get_concrete_function().graph.get_operations()]
        self.assertEqual(ops.count('While'), 1)
        self._AssertSame(want, step())

  def testTapePathRefusesInterleavedSchedules(self):
    x, _ = _Data()
    pipe = _Pipe(_MlpLayers(), 2, 4, 'always', '1f1b')
    self.assertTrue(pipe.needs_loss_inside)
    self.assertFalse(_Pipe(_MlpLayers(), 2, 4, 'always').needs_loss_inside)
    from gpipe_tf.pipeline import engine  # pylint: disable=g-import-not-at-top
    with self.assertRaisesRegex(engine.ScheduleNeedsLossError,
                                'ComputeLossAndGradients'):
      pipe.FProp(x, training=True)
    # Inference needs no loss: every schedule evaluates.
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=_MlpLayers()).Instantiate()
    self.assertAllClose(seq.FProp(x), pipe.FProp(x), rtol=1e-5, atol=1e-6)

  def testScalarLossIsANamedError(self):
    x, y = _Data()
    pipe = _Pipe(_MlpLayers(), 2, 4, 'always', '1f1b')

    def _MeanLoss(logits, labels):
      return loss_lib.LossTerms(
          tf.reduce_mean(losses.SoftmaxCrossEntropy(logits, labels)))

    with self.assertRaisesRegex(loss_lib.LossNotSplittableError,
                                'per-example'):
      pipe.ComputeLossAndGradients(x, y, _MeanLoss)
    with self.assertRaisesRegex(loss_lib.LossNotSplittableError, 'LossTerms'):
      pipe.ComputeLossAndGradients(x, y, lambda o, l: tf.reduce_sum(o))


if __name__ == '__main__':
  tf.test.main()
