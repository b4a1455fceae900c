"""Non-finite steps are skipped or stop the run; --deterministic runs repeat bit for bit."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import json  # pylint: disable=g-import-not-at-top
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

from gpipe_tf.train import checkpoints
from gpipe_tf import tasks
from gpipe_tf.train import loop
from gpipe_tf.layers import random_seeds
from params.synthetic import mlp

NAN_AT_STEP = 3  # Global step (before the step's increment) whose loss is NaN.
_REPO_ROOT = test_utils.REPO_ROOT


class _NanAtStepTask(tasks.ClassificationTask):
  """ClassificationTask whose loss is NaN at global step NAN_AT_STEP."""

  def ComputeLoss(self, batch, training=False):
    loss, metrics = super().ComputeLoss(batch, training)
    if training:
      step = random_seeds.CurrentStepSeed()[1]  # [task seed, global step].
      loss *= tf.where(tf.equal(step, NAN_AT_STEP), float('nan'), 1.0)
    return loss, metrics


class _NanAtStep(mlp.Tiny):

  def Task(self):
    p = super().Task()
    nan_p = _NanAtStepTask.Params()
    for name, value in p.IterParams():
      if name != 'cls':
        nan_p.Set(**{name: value})
    return nan_p


def _StepValues(logdir, step):
  """ckpt-<step>'s values without the global step and save counter."""
  return test_utils.CheckpointValues(logdir, step,
                                     skip=('save_counter', 'global_step'))


class NonFiniteTest(tf.test.TestCase):

  def testSkipLeavesEverythingUnchanged(self):
    logdir = self.get_temp_dir() + '/skip'
    result = loop.train_and_evaluate(
        _NanAtStep, logdir, 'train', max_steps=NAN_AT_STEP + 2,
        save_interval_steps=1, log_interval_steps=1)
    self.assertEqual(result.global_step, NAN_AT_STEP + 2)  # Still advances.
    self.assertEqual(result.skipped_steps, 1)
    self.assertTrue(all(np.isfinite(v) for v in result.train_metrics.values()))
    before = _StepValues(logdir, NAN_AT_STEP)      # After NAN_AT_STEP updates.
    after = _StepValues(logdir, NAN_AT_STEP + 1)   # After the NaN step.
    later = _StepValues(logdir, NAN_AT_STEP + 2)   # After one more good step.
    self.assertGreater(len(before), 6)  # Weights, Adam slots and iterations.
    self.assertEqual(sorted(before), sorted(after))
    for key in before:
      self.assertAllEqual(before[key], after[key], msg=key)
    self.assertTrue(any(not np.array_equal(after[k], later[k]) for k in after))
    # The summary is written at every logging step.
    skipped = test_utils.Scalars(logdir + '/train')['skipped_steps']
    self.assertEqual(skipped[NAN_AT_STEP], 0.0)
    self.assertEqual(skipped[NAN_AT_STEP + 1], 1.0)

  def testStopRaisesAndKeepsTheLastCheckpoint(self):
    logdir = self.get_temp_dir() + '/stop'
    with self.assertRaises(loop.NonFiniteLossError):
      loop.train_and_evaluate(_NanAtStep, logdir, 'train', max_steps=10,
                                   save_interval_steps=1,
                                   on_nonfinite='stop')
    newest = tf.train.latest_checkpoint(logdir + '/ckpt')
    self.assertEqual(checkpoints.CheckpointStep(newest), NAN_AT_STEP)
    checkpoints.VerifyReadable(newest)
    for value in _StepValues(logdir, NAN_AT_STEP).values():
      self.assertTrue(np.all(np.isfinite(value)))

  def testBadPolicyIsRejected(self):
    with self.assertRaisesRegex(ValueError, 'on_nonfinite'):
      loop.train_and_evaluate(mlp.Tiny, self.get_temp_dir() + '/bad',
                                   'train', max_steps=1, on_nonfinite='nope')


# Both runs in one child (a second would cost a TensorFlow import): the
# library's first, from a process where op determinism is off, then the
# trainer's main() with --deterministic, the flags it parses as a process.
# Each builds its own model, data and optimizer and seeds the global
# generators (loop.EnableDeterminism).
_RUN_DETERMINISTIC = """
import json, sys
sys.path.insert(0, 'tests')
import test_utils
test_utils.SetUpDevices()
from absl import flags
from tensorflow.python.framework import config
from gpipe_tf import trainer
from gpipe_tf.train import loop
from params.synthetic import mlp
lib_dir, cli_dir = sys.argv[1:]
result = loop.train_and_evaluate(mlp.TinyPipelined, lib_dir, 'train',
                                      max_steps=6, log_interval_steps=3,
                                      deterministic=True)
enabled = config.is_op_determinism_enabled()
flags.FLAGS(['trainer', '--model=synthetic.mlp.TinyPipelined',
             f'--logdir={cli_dir}', '--mode=train', '--max_steps=6',
             '--log_interval_steps=3', '--deterministic',
             '--num_logical_devices=4', '--num_replicas=1'])
trainer.main(['trainer'])
print(json.dumps({'loss': result.train_metrics['loss'], 'enabled': enabled}))
"""


def _LastLoss(logdir):
  losses = test_utils.Scalars(os.path.join(logdir, 'train'))['loss']
  return losses[max(losses)]


class DeterminismTest(tf.test.TestCase):
  """A fresh process: op determinism is process-wide and irreversible."""

  def testLibraryAndTrainerRunsAreBitIdentical(self):
    lib_dir = os.path.join(self.get_temp_dir(), 'lib')
    cli_dir = os.path.join(self.get_temp_dir(), 'cli')
    out = subprocess.run(
        [sys.executable, '-c', _RUN_DETERMINISTIC, lib_dir, cli_dir],
        cwd=_REPO_ROOT, capture_output=True, text=True, timeout=240,
        check=False)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    lib = json.loads(out.stdout.strip().splitlines()[-1])
    self.assertTrue(lib['enabled'])
    self.assertEqual(_LastLoss(lib_dir), _LastLoss(cli_dir))
    self.assertAllClose(_LastLoss(lib_dir), lib['loss'])
    a, b = (test_utils.CheckpointValues(lib_dir, skip=()),
            test_utils.CheckpointValues(cli_dir, skip=()))
    self.assertEqual(sorted(a), sorted(b))
    self.assertGreater(len(a), 6)
    for key, value in a.items():
      self.assertAllEqual(value, b[key], msg=key)


if __name__ == '__main__':
  tf.test.main()
