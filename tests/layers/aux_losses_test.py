"""aux_losses: what layers add is collected where the loss is made, and a Params layer's AddAuxLoss trains pipelined as it does unpipelined."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import aux_losses  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import core  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import shared_trace  # pylint: disable=g-import-not-at-top
from gpipe_tf.pipeline import loss as loss_lib  # pylint: disable=g-import-not-at-top
from gpipe_tf.pipeline import microbatch  # pylint: disable=g-import-not-at-top


class RoutedFC(core.FCLayer):
  """An FC layer (a class that shares its trace) that, in training, adds
  the squared batch mean of its outputs, times `coefficient`, to the loss:
  a router's load-balancing loss in miniature."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('coefficient', 0.5, 'Weight of the auxiliary loss.')
    return p

  def FProp(self, x, training=False):
    y = super().FProp(x, training=training)
    if training:
      self.AddAuxLoss(self.p.coefficient *
                      tf.square(tf.reduce_mean(y, axis=0)))
    return y


def _Layers():
  return [RoutedFC.Params().Set(name=f'fc{i}', input_dim=6, output_dim=6,
                                activation='TANH', coefficient=0.5 + i)
          for i in range(4)]


def _PerExample(y, t):
  return tf.reduce_mean(tf.square(y - t), axis=-1)


class AuxLossesTest(tf.test.TestCase):

  def testCollectSumsWhatIsAddedInItsScope(self):
    with aux_losses.Collect() as outer:
      self.assertAllEqual(outer.Total(), 0.0)
      aux_losses.Add(tf.constant([1.0, 2.0]))
      with aux_losses.Collect() as inner:
        aux_losses.Add(tf.constant(4, tf.int32))
      aux_losses.Add(tf.constant(8.0, tf.float64))
    self.assertAllEqual(outer.Total(), 11.0)
    self.assertAllEqual(inner.Total(), 4.0)
    self.assertEqual(outer.Total().dtype, tf.float32)
    with self.assertRaisesRegex(aux_losses.AuxLossNotCollectedError,
                                "layer 'x' adds .*Collect"):
      aux_losses.Add(1.0, "layer 'x'")

  def testParamsLayerAuxLossTrainsPipelinedAsUnpipelined(self):
    # Four layers of one kind (a shared trace would hide their terms: each
    # is traced on its own), K=2, M=4, 1f1b: the loss and gradients of
    # every micro-batch's mean loss plus its terms, averaged.
    x = tf.random.stateless_normal([8, 6], seed=[4, 1])
    t = tf.random.stateless_normal([8, 6], seed=[4, 2])
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=_Layers()).Instantiate()
    with tf.GradientTape() as tape:
      total = 0.0
      for xm, tm in zip(microbatch.Split([x], 4), microbatch.Split([t], 4)):
        with aux_losses.Collect() as aux:
          y = seq.FProp(xm[0], training=True)
        total += tf.reduce_mean(_PerExample(y, tm[0])) + aux.Total()
      want_loss = total / 4
    want = tape.gradient(want_loss, seq.trainable_variables)
    pipe = pipeline.PipeliningLayer.Params().Set(
        name='net', layers=_Layers(), num_partitions=2, num_micro_batches=4,
        schedule='1f1b').Instantiate()
    before = shared_trace.Stats.Get().traces
    loss, _, grads = tf.function(lambda: pipe.ComputeLossAndGradients(
        (x,), t, lambda o, l: loss_lib.LossTerms(_PerExample(o, l))))()
    # Not shared: its terms would stay inside a shared trace.
    self.assertEqual(shared_trace.Stats.Get().traces - before, 0)
    self.assertAllClose(want_loss, loss, rtol=1e-6)
    for a, b in zip(want, grads):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)


if __name__ == '__main__':
  tf.test.main()
