"""V-shaped schedules on the engine: 'zbv', 'dualpipe_v' and a PyTorch-format CSV train like SequentialLayer.

Through the public API only: a PipeliningLayer with num_virtual_stages=2 and
the schedule by name or as the path of a hand-written CSV in PyTorch's
format; ComputeLossAndGradients must give SequentialLayer's loss and
gradients (rtol 1e-5). The V-shaped placement puts cell s on device
min(s, 2K-1-s), so the first and last cells share device 0.
"""

import itertools
import os

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline.schedule import controllable

_TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'testdata')


def _LossFn(logits, labels):
  per_example = losses.SoftmaxCrossEntropy(logits, labels)
  weights = 1.0 + tf.cast(labels, tf.float32)  # Uneven: a lost example shows.
  return loss_lib.LossTerms(per_example, weights, {})


def _Data(n=12):
  x = tf.random.stateless_normal([n, 6], seed=[1, 2])
  y = tf.random.stateless_uniform([n], [5, 6], 0, 5, tf.int32)
  return x, y


def _Pipe(schedule, k, m, remat):
  return PipeliningLayer.Params().Set(
      name='net', layers=test_utils.MlpLayers(), num_partitions=k,
      num_micro_batches=m, num_virtual_stages=2, remat=remat,
      schedule=schedule).Instantiate()


class VShapeTransparencyTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.x, cls.y = _Data()
    seq = core.SequentialLayer.Params().Set(
        name='net', layers=test_utils.MlpLayers()).Instantiate()
    with tf.GradientTape() as tape:
      loss, _ = loss_lib.ReduceTerms(_LossFn(seq.FProp(cls.x), cls.y))
    cls.want = (loss, tape.gradient(loss, seq.trainable_variables))

  def _AssertSequential(self, pipe):
    loss, _, grads = pipe.ComputeLossAndGradients(self.x, self.y, _LossFn)
    want_loss, want_grads = self.want
    self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
    self.assertLen(grads, len(want_grads))
    for a, b in zip(want_grads, grads):
      self.assertIsNotNone(b)
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def testRegisteredSchedules(self):
    # Each (schedule, K, M) with two of the three remats, in turn, so each
    # schedule meets every remat (12 cells, not the product's 18);
    # support_test.testEveryCell adds every feature at once.
    remats = ('always', 'except_last', 'never')
    configs = [('zbv', 2, 4), ('zbv', 3, 3), ('zbv', 3, 7), ('zbv', 2, 1),
               ('dualpipe_v', 2, 4), ('dualpipe_v', 3, 6)]
    for (j, (name, k, m)), r in itertools.product(enumerate(configs), (0, 1)):
      remat = remats[(j + r) % 3]
      with self.subTest(schedule=name, k=k, m=m, remat=remat):
        pipe = _Pipe(name, k, m, remat)
        self.assertEqual(pipe.schedule.stage_devices,
                         tuple(min(s, 2 * k - 1 - s) for s in range(2 * k)))
        # Cells 0 and 2K-1 share device 0.
        self.assertEqual(pipe.cells[0].device, pipe.cells[-1].device)
        self._AssertSequential(pipe)

  def testControllableMemorySchedules(self):
    # V-Half and V-Min (schedule/controllable.py), given as Schedule objects.
    for (make, k, m), remat in itertools.product(
        [(controllable.VHalf, 2, 4), (controllable.VMin, 3, 5)],
        ('always', 'never')):
      with self.subTest(schedule=make.__name__, k=k, m=m, remat=remat):
        self._AssertSequential(_Pipe(make(k, m), k, m, remat))

  def testPyTorchCsv(self):
    # Hand-written in PyTorch's format: ZB-V and DualPipeV (with
    # OVERLAP_F_B cells), K = 2, M = 4, rank 0 holding stages 0 and 3.
    for name in ('zbv_k2_m4.torch.csv', 'dualpipe_v_k2_m4.torch.csv'):
      with self.subTest(file=name):
        pipe = _Pipe(os.path.join(_TESTDATA, name), 2, 4, 'except_last')
        self.assertEqual(pipe.schedule.stage_devices, (0, 1, 1, 0))
        self._AssertSequential(pipe)

  def testInFunction(self):
    # The graph path: every device's order pinned inside one tf.function.
    for name, m in (('zbv', 4), ('dualpipe_v', 5)):
      with self.subTest(schedule=name, m=m):
        pipe = _Pipe(name, 2, m, 'except_last')
        loss, _, grads = tf.function(
            lambda p=pipe: p.ComputeLossAndGradients(self.x, self.y, _LossFn))()
        want_loss, want_grads = self.want
        self.assertAllClose(want_loss, loss, rtol=1e-5, atol=1e-6)
        self.assertLen(grads, len(want_grads))
        for a, b in zip(want_grads, grads):
          self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)


if __name__ == '__main__':
  tf.test.main()
