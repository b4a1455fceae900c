"""Tests of gpipe_tf.tasks.lr_schedules: each schedule against its formula."""

import math


import keras  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.tasks import lr_schedules  # pylint: disable=g-import-not-at-top

STEPS = [0, 1, 2, 9, 10, 11, 50, 99, 100, 101, 399, 400, 1000]


def _Values(schedule, steps=STEPS):
  return np.array([float(schedule(s)) for s in steps])


class ConstantTest(tf.test.TestCase):

  def testEveryStepHasTheRate(self):
    s = lr_schedules.Constant.Params().Set(learning_rate=0.25).Instantiate()
    self.assertAllClose(_Values(s), [0.25] * len(STEPS))
    self.assertEqual(s(tf.constant(7, tf.int64)).dtype, tf.float32)

  def testNegativeRateRejected(self):
    with self.assertRaisesRegex(ValueError, 'learning_rate must be >= 0'):
      lr_schedules.Constant.Params().Set(learning_rate=-1.0).Instantiate()


class LinearWarmupRsqrtDecayTest(tf.test.TestCase):

  def testFormula(self):
    lr, warmup = 2.0, 100
    s = lr_schedules.LinearWarmupRsqrtDecay.Params().Set(
        learning_rate=lr, warmup_steps=warmup).Instantiate()
    expected = [lr * min((t + 1) / warmup, math.sqrt(warmup / (t + 1)))
                for t in STEPS]
    self.assertAllClose(_Values(s), expected, rtol=1e-6)

  def testShape(self):
    s = lr_schedules.LinearWarmupRsqrtDecay.Params().Set(
        learning_rate=1.0, warmup_steps=100).Instantiate()
    self.assertAllClose(float(s(0)), 0.01)     # Linear from the first step,
    self.assertAllClose(float(s(49)), 0.5)     # half way up,
    self.assertAllClose(float(s(99)), 1.0)     # peak at the end of warm-up,
    self.assertAllClose(float(s(399)), 0.5)    # 1/sqrt decay: 4x steps, 1/2.
    values = _Values(s, range(0, 1000, 7))
    peak = int(np.argmax(values))
    self.assertTrue(np.all(np.diff(values[:peak + 1]) > 0))
    self.assertTrue(np.all(np.diff(values[peak + 1:]) < 0))

  def testZeroWarmupRejected(self):
    with self.assertRaisesRegex(ValueError, 'warmup_steps must be >= 1'):
      lr_schedules.LinearWarmupRsqrtDecay.Params().Set(
          warmup_steps=0).Instantiate()


class CosineTest(tf.test.TestCase):

  def _Expected(self, t, lr, total, warmup, final):
    if t < warmup:
      return lr * (t + 1) / warmup
    progress = min((t - warmup) / (total - warmup), 1.0)
    return final + (lr - final) * 0.5 * (1 + math.cos(math.pi * progress))

  def testWithoutWarmup(self):
    s = lr_schedules.Cosine.Params().Set(learning_rate=1.0,
                                      total_steps=400).Instantiate()
    self.assertAllClose(_Values(s), [self._Expected(t, 1.0, 400, 0, 0.0)
                                     for t in STEPS], atol=1e-6)
    self.assertAllClose(float(s(200)), 0.5)
    self.assertAllClose(float(s(400)), 0.0, atol=1e-7)

  def testWarmupAndFloor(self):
    s = lr_schedules.Cosine.Params().Set(
        learning_rate=0.5, total_steps=400, warmup_steps=10,
        final_learning_rate=0.05).Instantiate()
    self.assertAllClose(_Values(s), [self._Expected(t, 0.5, 400, 10, 0.05)
                                     for t in STEPS], atol=1e-6)
    self.assertAllClose(float(s(9)), 0.5)       # Peak at the end of warm-up.
    self.assertAllClose(float(s(10)), 0.5)      # Cosine starts at the peak.
    self.assertAllClose(float(s(1000)), 0.05)   # Stays at the floor.

  def testBadParamsRejected(self):
    with self.assertRaisesRegex(ValueError, 'warmup_steps < total_steps'):
      lr_schedules.Cosine.Params().Set(total_steps=10,
                                    warmup_steps=10).Instantiate()
    with self.assertRaisesRegex(ValueError, 'final_learning_rate'):
      lr_schedules.Cosine.Params().Set(learning_rate=0.1,
                                    final_learning_rate=0.2).Instantiate()


class KerasIntegrationTest(tf.test.TestCase):

  def testIsAKerasScheduleUsableInTfFunction(self):
    s = lr_schedules.Cosine.Params().Set(learning_rate=1.0,
                                      total_steps=10).Instantiate()
    self.assertIsInstance(s, keras.optimizers.schedules.LearningRateSchedule)
    step = tf.Variable(5, dtype=tf.int64)
    self.assertAllClose(tf.function(lambda: s(step))(), 0.5)

  def testParamsFrozenCopy(self):
    p = lr_schedules.Constant.Params().Set(learning_rate=0.1)
    s = p.Instantiate()
    p.learning_rate = 0.2
    self.assertAllClose(float(s(0)), 0.1)
    self.assertTrue(s.params.IsFrozen())


if __name__ == '__main__':
  tf.test.main()
