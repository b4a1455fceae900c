"""Tests of gpipe_tf.tasks.classification: softmax cross-entropy loss and accuracy metrics."""

import test_utils  # pylint: disable=g-bad-import-order

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf import tasks  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import base_layer  # pylint: disable=g-import-not-at-top
from gpipe_tf.layers import core  # pylint: disable=g-import-not-at-top


class FixedLogits(base_layer.BaseLayer):
  """A model that ignores its input and returns Params.logits (plus 0 * w)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('logits', [[0.0]], 'Logits returned for every batch.')
    return p

  def __init__(self, params, parent_path=None):
    super().__init__(params, parent_path)
    self.CreateVariable('w', [1])

  def FProp(self, x, training=False):
    return tf.constant(self.p.logits, tf.float32) + 0.0 * self.w


def _Task(logits, **kwargs):
  p = tasks.ClassificationTask.Params().Set(
      model=FixedLogits.Params().Set(logits=logits), **kwargs)
  return p.Instantiate()


class ClassificationTaskTest(tf.test.TestCase):

  def testLossAndAccuracy(self):
    logits = [[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 1.0, 0.0],
              [1.0, 1.5, 0.0, 2.0]]
    labels = np.array([0, 2, 3], np.int32)
    task = _Task(logits)
    loss, metrics = task.ComputeLoss(
        {'inputs': tf.zeros([3, 5]), 'labels': labels})
    expected = -np.mean(test_utils.LogSoftmax(logits)[np.arange(3), labels])
    self.assertAllClose(loss, expected, rtol=1e-6)
    self.assertAllClose(metrics['loss'], expected, rtol=1e-6)
    self.assertAllClose(metrics['accuracy'], 2 / 3)  # Rows 0 and 2 are right.
    self.assertNotIn('top5_accuracy', metrics)       # Only 4 classes.

  def testTop5OnlyWithFiveClassesOrMore(self):
    logits = [[6.0, 5.0, 4.0, 3.0, 2.0, 1.0]] * 2
    task = _Task(logits)
    _, metrics = task.ComputeLoss(
        {'inputs': tf.zeros([2, 1]), 'labels': np.array([4, 5], np.int32)})
    self.assertAllClose(metrics['accuracy'], 0.0)
    self.assertAllClose(metrics['top5_accuracy'], 0.5)

  def testLabelSmoothingAndClipChangeTheLoss(self):
    logits = [[8.0, 0.0, 0.0]]
    batch = {'inputs': tf.zeros([1, 1]), 'labels': np.array([0], np.int32)}
    plain, _ = _Task(logits).ComputeLoss(batch)
    smooth, _ = _Task(logits, label_smoothing=0.3).ComputeLoss(batch)
    clipped, _ = _Task(logits, logits_clip=1.0).ComputeLoss(batch)
    log_p = test_utils.LogSoftmax(logits)[0]
    self.assertAllClose(smooth, 0.7 * -log_p[0] + 0.3 * -log_p.mean(),
                        rtol=1e-5)
    self.assertGreater(float(smooth), float(plain))
    self.assertGreater(float(clipped), float(plain))

  def testModelIsAChildUnderTheTaskPath(self):
    p = tasks.ClassificationTask.Params().Set(
        model=core.SequentialLayer.Params().Set(layers=[
            core.FCLayer.Params().Set(name='fc', input_dim=3, output_dim=2)]))
    task = p.Instantiate()
    names = sorted(v.name for v in task.trainable_variables)
    self.assertEqual(names, ['task/model/fc/b:0', 'task/model/fc/w:0'])
    meta = task.FPropMeta(task.params, (4, 3))
    self.assertEqual(meta.out_shapes, ((4, 2),))
    self.assertEqual(meta.num_params, 8)

  def testBadLabelSmoothingIsAConfigError(self):
    batch = {'inputs': tf.zeros([1, 1]), 'labels': np.array([0], np.int32)}
    with self.assertRaisesRegex(base_layer.LayerConfigError,
                                'label_smoothing'):
      _Task([[1.0, 0.0]], label_smoothing=1.0).ComputeLoss(batch)


if __name__ == '__main__':
  tf.test.main()
