"""Tests of gpipe_tf.train.warm_start and its train_lib hook: fine-tune from another run, resume your own."""

import os
import shutil
import tempfile


import test_utils  # pylint: disable=g-import-not-at-top,g-bad-import-order

test_utils.SetUpDevices()

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.train import checkpoints  # pylint: disable=g-import-not-at-top
from gpipe_tf.runtime import distribute  # pylint: disable=g-import-not-at-top
from gpipe_tf.train import loop  # pylint: disable=g-import-not-at-top
from gpipe_tf.train import runner as runner_lib  # pylint: disable=g-import-not-at-top
from gpipe_tf.train import warm_start  # pylint: disable=g-import-not-at-top
from params.synthetic import mlp  # pylint: disable=g-import-not-at-top

HEAD = r'^task/model/logits/'
RUN_ARGS = dict(save_interval_steps=100, log_interval_steps=100)


class FourClasses(mlp.Tiny):
  """The source run: Tiny on 4 classes."""
  NUM_CLASSES = 4


class ThreeClasses(mlp.Tiny):
  """The target: another class count, so another softmax layer."""
  NUM_CLASSES = 3
  INIT_FROM_CHECKPOINT = None

  def Task(self):
    p = super().Task()
    p.init_from_checkpoint = self.INIT_FROM_CHECKPOINT
    p.init_from_checkpoint_skip = [HEAD]
    return p


def _Values(task):
  return {v.name: v.numpy() for v in task.variables}


def _CheckpointValues(experiment, prefix):
  """{variable name: value} of the task of `experiment` saved at `prefix`."""
  task = experiment().Task().Instantiate()
  tf.train.Checkpoint(task=task).read(prefix).expect_partial()
  return _Values(task)


class WarmStartTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.source = os.path.join(cls.root, 'source')
    loop.train(FourClasses, cls.source, 3, **RUN_ARGS)
    cls.prefix = os.path.join(cls.source, 'ckpt', 'ckpt-3')
    cls.source_values = _CheckpointValues(FourClasses, cls.prefix)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def _FineTune(self, source):
    return type('FineTune', (ThreeClasses,), dict(INIT_FROM_CHECKPOINT=source))

  def testFineTuneStartsFromSourceThenResumesItsOwnCheckpoint(self):
    source = os.path.join(self.root, 'source_copy')
    shutil.copytree(self.source, source)
    experiment = self._FineTune(source)
    logdir = os.path.join(self.root, 'finetune')
    fresh = _Values(ThreeClasses().Task().Instantiate())

    # First start: the model comes from the source, the head is new.
    runner = runner_lib.Runner(experiment, logdir, 5)
    self.assertIsNone(runner.Restore())
    start = _Values(runner.task)
    self.assertCountEqual(start, fresh)
    for name, value in start.items():
      with self.subTest(name=name):
        if name.startswith('task/model/logits/'):
          self.assertAllEqual(value, fresh[name])  # Freshly initialised.
          self.assertNotEqual(value.shape, self.source_values[name].shape)
        else:
          self.assertAllEqual(value, self.source_values[name])
          self.assertNotAllClose(value, fresh[name])  # Really loaded.

    # Training runs from there.
    result = loop.train(experiment, logdir, 4, **RUN_ARGS)
    self.assertIsNone(result.restored_checkpoint)
    self.assertEqual((result.start_step, result.global_step), (0, 4))
    self.assertTrue(np.isfinite(result.train_metrics['loss']))
    own = _CheckpointValues(ThreeClasses, os.path.join(logdir, 'ckpt',
                                                       'ckpt-4'))

    # Resuming restores the run's own checkpoint; the source is not read
    # (it is gone) and the weights are the fine-tuned ones.
    shutil.rmtree(source)
    runner = runner_lib.Runner(experiment, logdir, 5)
    self.assertEndsWith(runner.Restore(), 'ckpt-4')
    for name, value in _Values(runner.task).items():
      self.assertAllEqual(value, own[name])
    resumed = loop.train(experiment, logdir, 6, **RUN_ARGS)
    self.assertEqual(resumed.start_step, 4)
    self.assertEqual(resumed.global_step, 6)

  def testWarmStartFillsEveryReplicasCopy(self):
    experiment = self._FineTune(self.source)
    logdir = os.path.join(self.root, 'replicated')
    runner = runner_lib.Runner(
        experiment, logdir, 5, strategy=distribute.MakeStrategy(2, 1))
    self.assertIsNone(runner.Restore())
    checked = 0
    for variable in runner.task.variables:
      if variable.name.startswith('task/model/logits/'):
        continue
      self.assertLen(variable.values, 2)  # One copy per replica.
      for copy in variable.values:
        self.assertAllEqual(copy.numpy(), self.source_values[variable.name])
        checked += 1
    self.assertGreater(checked, 4)
    result = loop.train(experiment, logdir, 2, num_replicas=2,
                             **RUN_ARGS)
    self.assertEqual(result.global_step, 2)
    self.assertTrue(np.isfinite(result.train_metrics['loss']))

  def testPathForms(self):
    for path in (self.source, os.path.join(self.source, 'ckpt'), self.prefix):
      with self.subTest(path=path):
        self.assertEqual(warm_start.ResolveCheckpoint(path), self.prefix)

  def testResultListsWhatWasLoaded(self):
    task = ThreeClasses().Task().Instantiate()
    result = warm_start.InitFromCheckpoint(task, self.source, [HEAD])
    self.assertEqual(result.checkpoint, self.prefix)
    self.assertCountEqual(result.skipped, ['task/model/logits/w',
                                           'task/model/logits/b'])
    self.assertLen(result.loaded, len(task.variables) - 2)
    self.assertCountEqual(result.unused, result.skipped)  # The old head.

  def testShapeMismatchNotSkippedNamesVariableAndBothShapes(self):
    task = ThreeClasses().Task().Instantiate()
    before = _Values(task)
    with self.assertRaisesRegex(warm_start.WarmStartShapeError,
                                r"'task/model/logits/\w' has shape \[.*3\] in "
                                r'the model but \[.*4\] in .*ckpt-3.*'
                                'init_from_checkpoint_skip'):
      warm_start.InitFromCheckpoint(task, self.source)
    for name, value in _Values(task).items():  # Nothing was written.
      self.assertAllEqual(value, before[name])

  def testVariableMissingFromSourceRaisesUnlessSkipped(self):

    class Deeper(FourClasses):

      def Task(self):
        p = super().Task()
        extra = p.model.layers[2].Copy().Set(name='fc2', input_dim=64)
        p.model.layers = p.model.layers[:3] + [extra] + p.model.layers[3:]
        return p

    task = Deeper().Task().Instantiate()
    with self.assertRaisesRegex(warm_start.WarmStartError,
                                r"'task/model/fc2/[wb]' .* is not in"):
      warm_start.InitFromCheckpoint(task, self.source)
    # Pairing is by name: the new layer keeps its initial value, the others
    # (the head included, though it moved in the list) are loaded.
    result = warm_start.InitFromCheckpoint(task, self.source, ['/fc2/'])
    self.assertLen(result.skipped, 2)
    values = _Values(task)
    self.assertAllEqual(values['task/model/logits/w:0'],
                        self.source_values['task/model/logits/w:0'])

  def testSkipPatternMatchingNothingRaises(self):
    task = ThreeClasses().Task().Instantiate()
    with self.assertRaisesRegex(warm_start.WarmStartError, 'matches no'):
      warm_start.InitFromCheckpoint(task, self.source, [HEAD, 'softmax'])
    with self.assertRaisesRegex(warm_start.WarmStartError, 'bad regular'):
      warm_start.InitFromCheckpoint(task, self.source, ['('])

  def testMissingSourceRaisesNamedErrorAtFirstStart(self):
    missing = os.path.join(self.root, 'nowhere')
    with self.assertRaisesRegex(warm_start.InitCheckpointNotFoundError,
                                'nowhere'):
      loop.train(self._FineTune(missing),
                      os.path.join(self.root, 'bad'), 1, **RUN_ARGS)
    self.assertFalse(os.path.exists(os.path.join(self.root, 'bad', 'ckpt')))

  def testEvaluationWithoutCheckpointDoesNotWarmStart(self):
    # The source is missing too: only the missing checkpoint is reported.
    with self.assertRaises(checkpoints.NoCheckpointError):
      loop.evaluate(self._FineTune(os.path.join(self.root, 'nowhere')),
                         os.path.join(self.root, 'eval_only'))


if __name__ == '__main__':
  tf.test.main()
