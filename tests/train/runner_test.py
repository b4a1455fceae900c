"""The trainer's steps (runner.py): an op that fails as a step runs names its pipeline's action."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import base_layer
from gpipe_tf.pipeline.schedule import action as action_lib
from gpipe_tf.train import loop
from gpipe_tf.train import runner as runner_lib
from params.synthetic import mlp


class _Negative(base_layer.BaseLayer):
  """Passes its input on, asserting it is all below zero: false for any
  input, so it fails in the first step's first action that runs it (an
  assert TensorFlow builds as a tf.cond, its Assert op in a branch
  function inside the piece's)."""

  def FProp(self, x, training=False):
    with tf.control_dependencies([tf.debugging.assert_less(x, 0.0)]):
      return tf.identity(x)

  @classmethod
  def FPropMeta(cls, p, shape):
    return base_layer.LayerMeta(0, (tuple(shape),), 0)


class _Failing(mlp.TinyPipelined):
  """TinyPipelined with _Negative after fc1, in stage 0 of 2."""

  def Task(self):
    p = super().Task()
    layers = list(p.model.layers)
    p.model.layers = layers[:3] + [_Negative.Params().Set(name='neg')] + (
        layers[3:])
    p.model.balance = [4, 1]
    return p


class _Remainder(mlp.TinyPipelined):
  """TinyPipelined evaluated on 232 examples: 7 batches of 32 and one of 8,
  which still splits into its 4 micro-batches."""

  def Test(self):
    return super().Test().Set(num_examples=232, drop_remainder=False)


class RunnerEvalTest(tf.test.TestCase):

  def testAnEvaluationWithASmallerLastBatchTracesItsStepOnce(self):
    runner = runner_lib.Runner(_Remainder, self.get_temp_dir(),
                               max_checkpoints_to_keep=1)
    sizes = []
    step = runner.EvalStep
    runner.EvalStep = lambda batch: sizes.append(
        int(tf.shape(batch['inputs'])[0])) or step(batch)
    results = runner.Evaluate(eval_steps=0)
    self.assertEqual(sizes, [32] * 7 + [8])
    self.assertEqual(runner._eval_step.experimental_get_tracing_count(), 1)
    self.assertBetween(results['accuracy'], 0.0, 1.0)

  def testOnlyTheBatchDimensionIsRelaxed(self):
    any_batch = runner_lib._AnyBatch  # pylint: disable=protected-access
    self.assertEqual(any_batch(tf.zeros([32, 16, 3])),
                     tf.TensorSpec([None, 16, 3], tf.float32))
    self.assertEqual(any_batch(tf.constant(1, tf.int64)),
                     tf.TensorSpec([], tf.int64))


class RunnerErrorTest(tf.test.TestCase):

  def testAnOpErrorOfATrainStepNamesItsActions(self):
    with self.assertRaises(tf.errors.InvalidArgumentError) as raised:
      loop.train_and_evaluate(_Failing, self.get_temp_dir(), 'train',
                              max_steps=1)
    e = raised.exception
    self.assertIsInstance(e.__cause__, tf.errors.InvalidArgumentError)
    self.assertIn('InvalidArgumentError in one of', str(e))
    self.assertIn('F of stage 0 on micro-batch 0, 1, 2 or 3', str(e))
    self.assertIn(action_lib.Action('F', 0, 0), e.where.actions)
    self.assertEqual({a.stage for a in e.where.actions}, {0})

  def testAnOpErrorOfAnEvalStepNamesItsActions(self):
    runner = runner_lib.Runner(_Failing, self.get_temp_dir(),
                               max_checkpoints_to_keep=1)
    with self.assertRaises(tf.errors.InvalidArgumentError) as raised:
      runner.Evaluate(eval_steps=1)
    self.assertIn('F of stage 0 on micro-batch 0, 1, 2 or 3',
                  str(raised.exception))


if __name__ == '__main__':
  tf.test.main()
