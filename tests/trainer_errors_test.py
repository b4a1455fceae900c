"""The trainer binary reports any named library error as one stderr line and exit status 1; --debug adds the traceback."""

import os
import re
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest

import test_utils

# Lines TensorFlow, absl and TFDS log on their own (not the trainer's answer).
_LOG_LINE = re.compile(r'^([IWEF]\d{4} |WARNING: All log messages before |'
                       r'\d{4}-\d\d-\d\d |\s*$)')


def _Trainer(logdir, *flags):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  return subprocess.run(
      [sys.executable, '-m', 'gpipe_tf.trainer', f'--logdir={logdir}',
       '--max_steps=1', '--mode=train', *flags],
      cwd=test_utils.REPO_ROOT, env=env, capture_output=True, text=True,
      timeout=300, check=False)


class TrainerErrorsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def _OneLineError(self, run, error_class):
    """The single 'trainer: error:' line of a failed run, checked."""
    self.assertEqual(run.returncode, 1, run.stderr[-3000:])
    own = [l for l in run.stderr.splitlines() if not _LOG_LINE.match(l)]
    self.assertLen(own, 1, run.stderr[-3000:])
    self.assertTrue(own[0].startswith(f'trainer: error: {error_class}: '),
                    own[0])
    self.assertNotIn('Traceback', run.stderr)
    return own[0]

  def testPartitionErrorIsOneLine(self):
    logdir = os.path.join(self.root, 'partition')
    run = _Trainer(logdir, '--model=synthetic.mlp.TinyPipelined',
                   '--num_logical_devices=2',
                   '--model_params_override=model.num_partitions : 3')
    line = self._OneLineError(run, 'PartitionError')
    self.assertIn('3', line)
    self.assertFalse(os.path.exists(os.path.join(logdir, 'ckpt')))

  def testMissingWarmStartCheckpointIsOneLine(self):
    missing = os.path.join(self.root, 'no_such_run')
    run = _Trainer(os.path.join(self.root, 'warm'),
                   '--model=synthetic.mlp.Tiny',
                   f"--model_params_override=init_from_checkpoint : "
                   f"'{missing}'")
    line = self._OneLineError(run, 'InitCheckpointNotFoundError')
    self.assertIn(f"init_from_checkpoint '{missing}'", line)

  def testUnknownOverrideKeyIsOneLineAndDebugShowsTheTraceback(self):
    logdir = os.path.join(self.root, 'override')
    flags = ['--model=synthetic.mlp.Tiny',
             '--model_params_override=learning_rate_schedle.learning_rate : 1']
    line = self._OneLineError(_Trainer(logdir, *flags), 'UnknownParamError')
    self.assertIn('--model_params_override', line)
    self.assertIn('Did you mean: task.learning_rate_schedule?', line)
    debug = _Trainer(logdir, *flags, '--debug')
    self.assertEqual(debug.returncode, 1)
    self.assertIn('Traceback (most recent call last)', debug.stderr)
    self.assertIn('hyperparams.py', debug.stderr)
    self.assertEqual(debug.stderr.strip().splitlines()[-1], line)
    self.assertFalse(os.path.exists(logdir))


if __name__ == '__main__':
  absltest.main()
