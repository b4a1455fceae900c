"""The trainer runs a pipelined experiment unchanged: it learns, checkpoints and resumes."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from gpipe_tf.train import loop
from params.synthetic import mlp


class _NoDropout(mlp.TinyPipelined):
  """Without dropout the pipelined run must equal the plain one exactly."""

  def Task(self):
    p = super().Task()
    p.model.layers = [l for l in p.model.layers if l.name != 'dropout']
    return p


class _PlainNoDropout(mlp.Tiny):

  def Task(self):
    p = super().Task()
    p.model.layers = [l for l in p.model.layers if l.name != 'dropout']
    return p


class _NoDropoutSchedule(_NoDropout):
  """The same model with a schedule that needs the loss inside the pipeline."""
  SCHEDULE = '1f1b'

  def Task(self):
    p = super().Task()
    p.model.schedule = self.SCHEDULE
    return p


class _NoDropoutZeroBubble(_NoDropoutSchedule):
  SCHEDULE = 'zb_h1'


class PipelinedTrainingTest(tf.test.TestCase):

  def testPipelinedExperimentLearnsAndResumes(self):
    logdir = self.get_temp_dir() + '/pipe'
    first = loop.train_and_evaluate(mlp.TinyPipelined, logdir,
                                         max_steps=20, save_interval_steps=10)
    self.assertEqual(first.global_step, 20)
    second = loop.train_and_evaluate(mlp.TinyPipelined, logdir,
                                          max_steps=40, save_interval_steps=10)
    self.assertEqual(second.start_step, 20)
    self.assertEqual(second.global_step, 40)
    self.assertGreater(second.eval_metrics['accuracy'], 0.5)  # Chance: 0.25.

  def testPipelinedTrainingEqualsPlainTraining(self):
    plain, piped = self.get_temp_dir() + '/plain', self.get_temp_dir() + '/p'
    loop.train_and_evaluate(_PlainNoDropout, plain, mode='train',
                                 max_steps=5)
    loop.train_and_evaluate(_NoDropout, piped, mode='train', max_steps=5)
    # Every saved value: weights (stored under the optimizer's path, where
    # the object graph meets them first), Adam slots, the global step.
    a, b = (test_utils.CheckpointValues(plain),
            test_utils.CheckpointValues(piped))
    self.assertEqual(sorted(a), sorted(b))
    self.assertGreater(len(a), 6)
    for name in a:
      np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-5,
                                 err_msg=name)

  def testEveryScheduleTrainsLikePlainTraining(self):
    # 1F1B and ZB-H1 go through the task's loss-inside path in the trainer.
    plain = self.get_temp_dir() + '/plain_s'
    loop.train_and_evaluate(_PlainNoDropout, plain, mode='train', max_steps=5)
    want = test_utils.CheckpointValues(plain)
    for experiment in (_NoDropoutSchedule, _NoDropoutZeroBubble):
      with self.subTest(schedule=experiment.SCHEDULE):
        logdir = self.get_temp_dir() + '/' + experiment.SCHEDULE
        result = loop.train_and_evaluate(experiment, logdir, mode='train',
                                         max_steps=5)
        self.assertEqual(result.global_step, 5)
        got = test_utils.CheckpointValues(logdir)
        self.assertEqual(sorted(want), sorted(got))
        for name in want:
          np.testing.assert_allclose(want[name], got[name], rtol=1e-4,
                                     atol=1e-5, err_msg=name)


if __name__ == '__main__':
  tf.test.main()
