"""BatchNorm under micro-batching: per-micro-batch normalisation, one moving-stats update
per mini-batch from all micro-batches, and sums across tf.distribute replicas."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from gpipe_tf.layers import core
from gpipe_tf.layers import normalization
from gpipe_tf.pipeline import PipeliningLayer


def _Layers(decay=0.5):
  return [
      core.FCLayer.Params().Set(name='fc0', input_dim=6, output_dim=8,
                                activation='NONE'),
      normalization.BatchNormLayer.Params().Set(name='bn0', dim=8,
                                                decay=decay),
      core.ActivationLayer.Params().Set(name='relu', activation='RELU'),
      core.FCLayer.Params().Set(name='fc1', input_dim=8, output_dim=8,
                                activation='NONE'),
      normalization.BatchNormLayer.Params().Set(name='bn1', dim=8,
                                                decay=decay),
  ]


class BatchNormPipelineTest(tf.test.TestCase):

  def _Models(self, k, m, remat):
    seq = core.SequentialLayer.Params().Set(name='net',
                                            layers=_Layers()).Instantiate()
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=_Layers(), num_partitions=k, num_micro_batches=m,
        remat=remat).Instantiate()
    return seq, pipe

  def _Step(self, model, x):
    """One training step (forward + backward) of `model` on `x`."""
    if not hasattr(model, '_test_step'):

      @tf.function
      def _Train(x):
        with tf.GradientTape() as tape:
          loss = tf.reduce_sum(tf.square(model.FProp(x, training=True)))
        return tape.gradient(loss, model.trainable_variables)

      model._test_step = _Train  # pylint: disable=protected-access
    return model._test_step(x)  # pylint: disable=protected-access

  def testMovingStatsEqualFullBatchAfterOneStep(self):
    x = tf.random.stateless_normal([12, 6], [1, 2]) * 3.0 + 1.0
    for k, m, remat in [(2, 4, 'always'), (1, 3, 'never'),
                        (2, 2, 'except_last')]:
      with self.subTest(k=k, m=m, remat=remat):
        seq, pipe = self._Models(k, m, remat)
        self._Step(seq, x)
        self._Step(pipe, x)
        # bn0 sees the same inputs in both models, so its statistics must be
        # those of the whole mini-batch, updated exactly once.
        bn_seq, bn_pipe = seq.layers[1], pipe.layers[1]
        self.assertAllClose(bn_seq.moving_mean, bn_pipe.moving_mean,
                            atol=1e-5)
        self.assertAllClose(bn_seq.moving_variance, bn_pipe.moving_variance,
                            atol=1e-4)
        self.assertNotAllClose(bn_pipe.moving_mean, tf.zeros([8]))

  def testTrainingNormalisesPerMicroBatch(self):
    x = tf.random.stateless_normal([8, 6], [3, 4]) * 2.0 + 0.5
    _, pipe = self._Models(1, 2, 'never')
    seq_half = core.SequentialLayer.Params().Set(
        name='net', layers=_Layers()).Instantiate()
    y = pipe.FProp(x, training=True)
    halves = [seq_half.FProp(x[:4], training=True),
              seq_half.FProp(x[4:], training=True)]
    self.assertAllClose(y, tf.concat(halves, 0), atol=1e-5)

  def testEvalUsesMovingStats(self):
    """Trains the pipeline (K=2, M=4) for a few optimizer steps, then
    evaluates the pipeline itself: it normalises with the moving statistics,
    as a SequentialLayer over the same weights does in eval, and not with
    the statistics of the batch or of its micro-batches."""
    x = tf.random.stateless_normal([8, 6], [5, 6]) * 2.0 + 1.5
    _, pipe = self._Models(2, 4, 'always')
    self.assertEqual(pipe.balance, [3, 2])  # bn0 in cell 0, bn1 in cell 1.
    bns = [pipe.layers[1], pipe.layers[4]]
    opt = tf.keras.optimizers.SGD(0.01)

    @tf.function
    def _Train():
      with tf.GradientTape() as tape:
        y = pipe.FProp(x, training=True)
        loss = tf.reduce_mean(tf.square(y - 1.0))
      opt.apply_gradients(zip(tape.gradient(loss, pipe.trainable_variables),
                              pipe.trainable_variables))

    kernel = tf.identity(pipe.layers[0].w)
    stats = [[tf.identity(v) for bn in bns
              for v in (bn.moving_mean, bn.moving_variance)]]
    for _ in range(3):
      _Train()
      stats.append([tf.identity(v) for bn in bns
                    for v in (bn.moving_mean, bn.moving_variance)])
    # Real steps: the weights changed, and every step moved every moving
    # statistic (away from its initial 0 / 1 too).
    self.assertNotAllClose(kernel, pipe.layers[0].w)
    for before, after in zip(stats, stats[1:]):
      for a, b in zip(before, after):
        self.assertNotAllClose(a, b, atol=1e-3)

    # The same weights, moving statistics included, in a SequentialLayer.
    def _Copy():
      seq = core.SequentialLayer.Params().Set(
          name='net', layers=_Layers()).Instantiate()
      for ls, lp in zip(seq.layers, pipe.layers):
        self.assertEqual(len(ls.variables), len(lp.variables))
        for a, b in zip(ls.variables, lp.variables):
          a.assign(b)
      return seq

    h = tf.random.stateless_normal([8, 6], [7, 8]) * 2.0 + 1.0
    got = pipe.FProp(h, training=False)
    self.assertAllClose(got, _Copy().FProp(h, training=False), atol=1e-5)
    # Eval updates nothing.
    for a, b in zip(stats[-1], [v for bn in bns
                                for v in (bn.moving_mean,
                                          bn.moving_variance)]):
      self.assertAllEqual(a, b)
    # Batch statistics (of the whole batch, or of each micro-batch of 2) give
    # something else: a pipeline normalising with them in eval fails above.
    batch = _Copy()
    self.assertNotAllClose(got, batch.FProp(h, training=True), atol=1e-2)
    per_micro_batch = tf.concat(
        [batch.FProp(h[i:i + 2], training=True) for i in range(0, 8, 2)], 0)
    self.assertNotAllClose(got, per_micro_batch, atol=1e-2)

  def testCrossReplicaSumsStatistics(self):
    devices = test_utils.devices.LogicalCpus()[:2]
    strategy = tf.distribute.MirroredStrategy(devices)
    x = np.random.RandomState(0).normal(2.0, 3.0, size=[8, 4]).astype(
        np.float32)
    with strategy.scope():
      bn = normalization.BatchNormLayer.Params().Set(
          name='bn', dim=4, decay=0.0).Instantiate()
    dist = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(x[4 * ctx.replica_id_in_sync_group:][:4]))

    @tf.function
    def _Run():
      strategy.run(lambda v: bn.FProp(v, training=True), args=(dist,))

    _Run()
    # decay=0: the moving statistics are exactly the global batch's.
    self.assertAllClose(bn.moving_mean, x.mean(0), atol=1e-5)
    self.assertAllClose(bn.moving_variance, x.var(0), atol=1e-4)


if __name__ == '__main__':
  tf.test.main()
