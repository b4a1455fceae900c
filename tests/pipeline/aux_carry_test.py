"""aux_carry: losses Keras layers add with add_loss (a MoE router's) are in a pipeline's loss and gradients, in every schedule, as Keras's own step has them."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import aux_losses  # pylint: disable=g-import-not-at-top
from gpipe_tf.pipeline import loss as loss_lib  # pylint: disable=g-import-not-at-top
from gpipe_tf.pipeline import microbatch  # pylint: disable=g-import-not-at-top


def _PerExample(outputs, targets):
  return tf.reduce_mean(tf.square(outputs - targets), axis=-1)


def _KerasStep(model, x, targets, m):
  """Keras's own loss (compute_loss: the compiled loss plus model.losses)
  and gradients, over m micro-batches taken in turn, averaged: at m=1
  exactly Keras's train step."""
  variables = model.trainable_variables
  with tf.GradientTape() as tape:
    total = 0.0
    for xm, tm in zip(microbatch.Split([x], m), microbatch.Split([targets], m)):
      y = model(xm[0], training=True)
      total += model.compute_loss(x=xm[0], y=tm[0], y_pred=y, training=True)
    loss = total / m
  return loss, tape.gradient(loss, variables)


def _Pipelined(model, x, targets, m, **settings):
  pipe = pipeline.PipeliningLayer.Params().Set(
      name='net', layers=pipeline.FromKeras(model), num_partitions=2,
      num_micro_batches=m, **settings).Instantiate()
  pairs = {id(a): b for a, b in pipeline.LoadKerasWeights(pipe, model)}
  loss, metrics, grads = pipe.ComputeLossAndGradients(
      (x,), targets, lambda o, t: loss_lib.LossTerms(_PerExample(o, t)))
  by_var = dict(zip(map(id, pipe.trainable_variables), grads))
  return pipe, loss, metrics, [by_var[id(pairs[id(v)])]
                               for v in model.trainable_variables]


class AuxCarryTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.model = test_utils.KerasAuxLossModel()
    self.x = tf.random.stateless_normal([8, 6], seed=[1, 2])
    self.targets = tf.random.stateless_normal([8, 3], seed=[1, 3])

  def _AssertEqual(self, want, got):
    (want_loss, want_grads), (loss, grads) = want, got
    self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
    for a, b in zip(want_grads, grads):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testEqualsKerasStepAtOneMicroBatch(self):
    want = _KerasStep(self.model, self.x, self.targets, 1)
    # The terms are not vacuous: without them the loss is another.
    plain = tf.reduce_mean(_PerExample(self.model(self.x), self.targets))
    self.assertGreater(float(want[0] - plain), 0.05)
    for schedule in ('gpipe', '1f1b', 'zb_h1'):
      with self.subTest(schedule=schedule):
        pipe, loss, metrics, grads = _Pipelined(
            self.model, self.x, self.targets, 1, schedule=schedule)
        self.assertEqual([len(c.layers) for c in pipe.cells], [2, 2])
        self._AssertEqual(want, (loss, grads))
        self.assertAllClose(metrics['loss'], loss)

  def testEqualsKerasOverMicroBatchesInEverySchedule(self):
    # Per micro-batch, as BatchNorm: each micro-batch's terms are its own
    # (they are nonlinear in the batch), each weighed 1/M here.
    want = _KerasStep(self.model, self.x, self.targets, 4)
    whole = _KerasStep(self.model, self.x, self.targets, 1)
    self.assertGreater(abs(float(want[0] - whole[0])), 1e-3)
    for schedule, settings in (
        ('gpipe', {}), ('1f1b', {}), ('zb_h1', {}),
        ('1f1b', dict(remat='always', execution='unrolled')),
        ('zb_h1', dict(remat='always', execution='switch')),
        ('gpipe', dict(execution='folded')),
        ('interleaved_1f1b', dict(num_virtual_stages=2)),
        ('zbv', dict(num_virtual_stages=2, remat='always'))):
      with self.subTest(schedule=schedule, **settings):
        _, loss, _, grads = _Pipelined(self.model, self.x, self.targets, 4,
                                       schedule=schedule, **settings)
        self._AssertEqual(want, (loss, grads))

  def testTapePathGivesTheTermsToTheCollectorInScope(self):
    # FProp under a tape (gpipe): the pipeline adds the batch's terms to
    # the aux_losses.Collect() in scope, as a SequentialLayer's layers do.
    want = _KerasStep(self.model, self.x, self.targets, 2)
    params = pipeline.FromKeras(self.model)
    for net in (
        pipeline.PipeliningLayer.Params().Set(
            name='net', layers=params, num_partitions=2,
            num_micro_batches=2).Instantiate(),
        layers.SequentialLayer.Params().Set(name='net', layers=params)
        .Instantiate()):
      with self.subTest(net=type(net).__name__):
        pairs = {id(a): b for a, b in pipeline.LoadKerasWeights(net,
                                                                self.model)}
        variables = [pairs[id(v)] for v in self.model.trainable_variables]
        with self.assertRaisesRegex(aux_losses.AuxLossNotCollectedError,
                                    'Collect'):
          net.FProp(self.x, training=True)
        with tf.GradientTape() as tape:
          if isinstance(net, layers.SequentialLayer):
            total = 0.0
            for xm, tm in zip(microbatch.Split([self.x], 2),
                              microbatch.Split([self.targets], 2)):
              with aux_losses.Collect() as aux:
                y = net.FProp(xm[0], training=True)
              total += tf.reduce_mean(_PerExample(y, tm[0])) + aux.Total()
            loss = total / 2
          else:
            with aux_losses.Collect() as aux:
              y = net.FProp(self.x, training=True)
            loss = tf.reduce_mean(_PerExample(y, self.targets)) + aux.Total()
        self._AssertEqual(want, (loss, tape.gradient(loss, variables)))

  def testTapeAndLossInsideWeighTheTermsAsDocumented(self):
    # Loss inside: micro-batch m's terms weigh W_m / W (its share of the
    # loss weight); tape path: n_m / N (its share of the examples). Equal
    # when every example weighs alike; not with weights that differ.
    def _Aux(xm):
      self.model(xm, training=True)
      return float(tf.add_n(self.model.losses))

    aux = [_Aux(xm[0]) for xm in microbatch.Split([self.x], 2)]
    self.assertGreater(abs(aux[0] - aux[1]), 1e-3)
    pipe = pipeline.PipeliningLayer.Params().Set(
        name='net', layers=pipeline.FromKeras(self.model), num_partitions=2,
        num_micro_batches=2).Instantiate()
    pipeline.LoadKerasWeights(pipe, self.model)
    per_example = _PerExample(self.model(self.x), self.targets)
    for weights in (None, tf.constant([1., 1, 1, 1, 1, 0, 0, 0])):
      w = tf.ones([8]) if weights is None else weights
      with self.subTest(weighted=weights is not None):
        plain = float(tf.reduce_sum(per_example * w) / tf.reduce_sum(w))
        shares = [float(tf.reduce_sum(wm) / tf.reduce_sum(w))
                  for wm in (w[:4], w[4:])]
        labels = (self.targets, w)
        inside, _, _ = pipe.ComputeLossAndGradients(
            (self.x,), labels, lambda o, t: loss_lib.LossTerms(
                _PerExample(o, t[0]), weights=t[1]))
        self.assertAllClose(
            inside, plain + shares[0] * aux[0] + shares[1] * aux[1],
            rtol=1e-5)
        with aux_losses.Collect() as collected:
          y = pipe.FProp(self.x, training=True)
        tape = (tf.reduce_sum(_PerExample(y, self.targets) * w) /
                tf.reduce_sum(w) + collected.Total())
        self.assertAllClose(tape, plain + (aux[0] + aux[1]) / 2, rtol=1e-5)
        if weights is None:
          self.assertAllClose(inside, tape, rtol=1e-5)
        else:
          self.assertGreater(abs(float(inside - tape)), 1e-3)


if __name__ == '__main__':
  tf.test.main()
