"""A variable used several times (two layers of one cell, two cells, the loss) gets the sum of its uses' gradients, as SequentialLayer's."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import loss as loss_lib



def _Fc(i, dout=8):
  return core.FCLayer.Params().Set(name=f'fc{i}', input_dim=8,
                                   output_dim=dout, activation='TANH')


def _Layers():
  return [_Fc(0), test_utils.TiedScale.Params().Set(name='t0'), _Fc(1),
          test_utils.TiedScale.Params().Set(name='t1'), _Fc(2),
          test_utils.TiedScale.Params().Set(name='t2'), _Fc(3, 5)]


def _LossFn(logits, labels):
  # The loss reads the shared variable too (a temperature, say).
  logits = logits * tf.reduce_mean(test_utils.SHARED['v'])
  return loss_lib.LossTerms(losses.SoftmaxCrossEntropy(logits, labels))


class SharedVariablesTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    test_utils.SHARED['v'] = tf.Variable(tf.fill([8], 1.25), name='shared')
    self.x = tf.random.stateless_normal([6, 8], [5, 5])
    self.y = tf.constant([0, 1, 2, 3, 4, 0])
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=_Layers()).Instantiate()
    # tf.Module lists the variable once although three layers track it.
    self.assertLen([v for v in seq.trainable_variables
                    if v is test_utils.SHARED['v']], 1)
    with tf.GradientTape() as tape:
      loss, _ = loss_lib.ReduceTerms(_LossFn(seq.FProp(self.x), self.y))
    self.want = tape.gradient(loss, seq.trainable_variables)
    self.seq = seq

  def _Pipe(self, balance, schedule='gpipe', execution='loop',
            remat='always'):
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=_Layers(), num_micro_batches=3, balance=balance,
        num_partitions=len(balance), schedule=schedule, remat=remat,
        execution=execution).Instantiate()
    for a, b in zip(pipe.trainable_variables, self.seq.trainable_variables):
      a.assign(b)
    return pipe

  def _AssertWanted(self, got):
    self.assertLen(got, len(self.want))
    for a, b in zip(self.want, got):
      self.assertIsNotNone(b)
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testLossInside(self):
    # [4, 3]: cell 0 holds t0 and t1 (one cell, two layers tracking it),
    # cell 1 holds t2, and the loss reads it as well. Steps this small build
    # whole under 'loop' too (periods.Fold), so the two executions build the
    # same graph: each schedule runs one, both run (3 cells, not 6).
    for schedule, execution in (('gpipe', 'loop'), ('1f1b', 'unrolled'),
                                ('zb_h1', 'loop')):
      with self.subTest(schedule=schedule, execution=execution):
        pipe = self._Pipe([4, 3], schedule, execution)
        _, _, got = tf.function(lambda p=pipe: p.ComputeLossAndGradients(
            self.x, self.y, _LossFn))()
        self._AssertWanted(got)

  def testTapePath(self):
    # One cell, two cells (t0 and t1 in one), three cells: the recompute
    # ('always') where the variable crosses cells, 'never' in one cell; the
    # tape path with [8, 8] and remat 'never' (two cells, t0 and t1 in one,
    # the loss reading it) is support_test.testEveryCell's (eager) gpipe V=1
    # 'tape' cell, 'except_last' over four cells its gpipe V=2 one.
    for balance, remat in (([4, 3], 'always'), ([7], 'never'),
                           ([2, 2, 3], 'always')):
      with self.subTest(balance=balance, remat=remat):
        pipe = self._Pipe(balance, remat=remat)

        @tf.function
        def _Step(p=pipe):
          with tf.GradientTape() as tape:
            loss, _ = loss_lib.ReduceTerms(
                _LossFn(p.FProp(self.x, training=True), self.y))
          return tape.gradient(loss, p.trainable_variables)

        self._AssertWanted(_Step())


if __name__ == '__main__':
  tf.test.main()
