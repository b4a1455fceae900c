"""Tests of gpipe_tf.tasks.base_task: the model child, gradient clipping, the optimizer and schedule from Params."""

import keras
import tensorflow as tf

from gpipe_tf import tasks
from gpipe_tf.layers import base_layer
from gpipe_tf.layers import core
from gpipe_tf.tasks import lr_schedules
from gpipe_tf.tasks import optimizers


class _AuxFC(core.FCLayer):
  """An FC layer that adds 0.25 * sum(w^2) to the training loss."""

  def FProp(self, x, training=False):
    if training:
      self.AddAuxLoss(0.25 * tf.reduce_sum(tf.square(self.w)))
    return super().FProp(x, training=training)


def _TaskParams(**kwargs):
  """A ClassificationTask over one FC layer (3 -> 2): BaseTask's behaviour."""
  return tasks.ClassificationTask.Params().Set(
      model=core.FCLayer.Params().Set(input_dim=3, output_dim=2), **kwargs)


class BaseTaskTest(tf.test.TestCase):

  def testClipGradients(self):
    task = _TaskParams(clip_gradient_norm_to_value=1.0).Instantiate()
    grads, norm = task.ClipGradients([tf.constant([3.0]), tf.constant([4.0])])
    self.assertAllClose(norm, 5.0)
    self.assertAllClose(grads, [[0.6], [0.8]])
    unclipped, norm = _TaskParams().Instantiate().ClipGradients(
        [tf.constant([3.0])])
    self.assertAllClose(unclipped, [[3.0]])
    self.assertAllClose(norm, 3.0)

  def testCreateOptimizerFromParams(self):
    task = _TaskParams(
        optimizer=optimizers.SGD.Params().Set(momentum=0.5)).Instantiate()
    opt = task.CreateOptimizer()
    self.assertIsInstance(opt, keras.optimizers.SGD)
    self.assertAllClose(opt.momentum, 0.5)
    self.assertIs(opt._learning_rate, task.learning_rate_schedule)  # pylint: disable=protected-access

  def testScheduleAndSeedFromParams(self):
    task = _TaskParams(
        learning_rate_schedule=lr_schedules.Constant.Params().Set(
            learning_rate=0.25), random_seed=9).Instantiate()
    self.assertAllClose(task.learning_rate_schedule(tf.constant(3)), 0.25)
    self.assertEqual(task.step_seed, 9)
    self.assertEqual(_TaskParams().Instantiate().step_seed, 0)

  def testOnlyModelVariablesBelongToTheTask(self):
    task = _TaskParams().Instantiate()
    opt = task.CreateOptimizer()
    opt.build(task.trainable_variables)
    self.assertEqual(sorted(v.name for v in task.variables),
                     ['task/model/b:0', 'task/model/w:0'])

  def testBadParamsAreConfigErrors(self):
    with self.assertRaisesRegex(base_layer.LayerConfigError, 'has no model'):
      tasks.ClassificationTask.Params().Instantiate()
    with self.assertRaisesRegex(base_layer.LayerConfigError,
                                'clip_gradient_norm_to_value'):
      _TaskParams(clip_gradient_norm_to_value=-1.0).Instantiate()

  def testComputeLossIsAbstractAndFPropCallsIt(self):
    p = tasks.BaseTask.Params().Set(model=core.FCLayer.Params().Set(
        input_dim=3, output_dim=2))
    with self.assertRaises(NotImplementedError):
      p.Instantiate().FProp({'inputs': tf.zeros([1, 3])})
    meta = tasks.BaseTask.FPropMeta(p, (4, 3))
    self.assertEqual(meta.out_shapes, ((4, 2),))

  def testScheduleThatNeedsTheLossInsideNeedsLossTerms(self):
    from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
    from gpipe_tf.pipeline import loss as loss_lib  # pylint: disable=g-import-not-at-top

    class _MeanOnly(tasks.BaseTask):
      """A task that overrides ComputeLoss only (no per-example terms)."""

      def ComputeLoss(self, batch, training=False):
        return tf.reduce_mean(self.model.FProp(batch['inputs'],
                                               training=training)), {}

    layers = [core.FCLayer.Params().Set(name=f'fc{i}', input_dim=3,
                                        output_dim=3) for i in range(2)]
    model = PipeliningLayer.Params().Set(
        name='net', layers=layers, num_partitions=2, num_micro_batches=2,
        schedule='1f1b')
    batch = {'inputs': tf.ones([4, 3])}
    task = _MeanOnly.Params().Set(model=model.Copy()).Instantiate()
    with self.assertRaisesRegex(loss_lib.LossNotSplittableError, 'LossTerms'):
      task.ComputeLossAndGradients(batch, task.trainable_variables)
    # With GPipe the GradientTape path trains it.
    task = _MeanOnly.Params().Set(
        model=model.Copy().Set(schedule='gpipe')).Instantiate()
    _, _, grads = task.ComputeLossAndGradients(batch, task.trainable_variables)
    self.assertNotIn(None, grads)

  def testBatchSize(self):
    self.assertEqual(int(tasks.BatchSize({'a': tf.zeros([5, 2]),
                                          'b': tf.zeros([5])})), 5)

  def testAuxLossIsInTheLossAndGradients(self):
    # A layer's AddAuxLoss: in ComputeLoss's loss and 'loss' metric in
    # training (not in evaluation), and in the gradients.
    task = tasks.ClassificationTask.Params().Set(
        model=_AuxFC.Params().Set(input_dim=3, output_dim=2)).Instantiate()
    batch = {'inputs': tf.ones([4, 3]), 'labels': tf.constant([0, 1, 1, 0])}
    plain, _ = task.ComputeLoss(batch)
    loss, metrics, grads = task.ComputeLossAndGradients(
        batch, [task.model.w])
    aux = 0.25 * tf.reduce_sum(tf.square(task.model.w))
    self.assertGreater(float(aux), 0.01)
    self.assertAllClose(loss, plain + aux)
    self.assertAllClose(metrics['loss'], loss)
    with tf.GradientTape() as tape:  # Evaluation's loss, plus the term.
      want = task.ComputeLoss(batch)[0] + 0.25 * tf.reduce_sum(
          tf.square(task.model.w))
    self.assertAllClose(grads[0], tape.gradient(want, task.model.w))


if __name__ == '__main__':
  tf.test.main()
