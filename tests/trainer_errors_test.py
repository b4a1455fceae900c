"""The trainer binary reports any named library error as one stderr line and exit status 1; --debug adds the traceback."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
import pytest

import test_utils

# Lines TensorFlow, absl and TFDS log on their own (not the trainer's answer).
_LOG_LINE = re.compile(r'^([IWEF]\d{4} |WARNING: All log messages before |'
                       r'\d{4}-\d\d-\d\d |\s*$)')

# One child process runs the trainer's entry point (app.run(trainer.main), all
# that `python -m gpipe_tf.trainer` runs) once per case (tests/entry_point.py):
# every case but the last through RunCapturingStderr; the last case ends the
# child itself, so its stderr and exit status are the process's own.
# argv[1]: JSON [[flag, ...], ...]; stdout: JSON [[status, stderr], ...] of
# the captured cases.
_DRIVER = r'''
import json, sys
from absl import app, flags
from gpipe_tf import trainer
import entry_point

cases = json.loads(sys.argv[1])
results = [entry_point.RunCapturingStderr(trainer.main, ['trainer'] + case)
           for case in cases[:-1]]
print(json.dumps(results), flush=True)
flags.FLAGS.unparse_flags()
app.run(trainer.main, argv=['trainer'] + cases[-1])
'''


def _Args(logdir, *flags):
  return [f'--logdir={logdir}', '--max_steps=1', '--mode=train', *flags]


# One worker runs the whole class, so its one child (setUpClass) runs once
# under `pytest -n 2 --dist loadgroup`.
@pytest.mark.xdist_group('trainer_errors_test')
class TrainerErrorsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.partition_dir = os.path.join(cls.root, 'partition')
    cls.missing = os.path.join(cls.root, 'no_such_run')
    cls.override_dir = os.path.join(cls.root, 'override')
    cls.override_flags = [
        '--model=synthetic.mlp.Tiny',
        '--model_params_override=learning_rate_schedle.learning_rate : 1']
    # The partition case first: its --num_logical_devices=2 splits the CPU
    # before TensorFlow starts, as in a process of its own.
    cases = [
        _Args(cls.partition_dir, '--model=synthetic.mlp.TinyPipelined',
              '--num_logical_devices=2',
              '--model_params_override=model.num_partitions : 3'),
        _Args(os.path.join(cls.root, 'warm'), '--model=synthetic.mlp.Tiny',
              f"--model_params_override=init_from_checkpoint : "
              f"'{cls.missing}'"),
        _Args(cls.override_dir, *cls.override_flags),
        _Args(cls.override_dir, *cls.override_flags, '--debug'),
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3',
               PYTHONPATH=test_utils.CHILD_PYTHONPATH)
    run = subprocess.run(
        [sys.executable, '-c', _DRIVER, json.dumps(cases)],
        cwd=test_utils.REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=300, check=False)
    captured = json.loads(run.stdout.splitlines()[0]) if run.stdout else []
    cls.runs = [subprocess.CompletedProcess(case, status, '', stderr)
                for case, (status, stderr) in zip(cases, captured)]
    cls.runs.append(run)  # The last case: the child's own exit.
    cls.num_cases = len(cases)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def setUp(self):
    super().setUp()
    self.assertLen(self.runs, self.num_cases, self.runs[-1].stderr[-3000:])

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
    line = self._OneLineError(self.runs[0], 'PartitionError')
    self.assertIn('3', line)
    self.assertFalse(os.path.exists(os.path.join(self.partition_dir, 'ckpt')))

  def testMissingWarmStartCheckpointIsOneLine(self):
    line = self._OneLineError(self.runs[1], 'InitCheckpointNotFoundError')
    self.assertIn(f"init_from_checkpoint '{self.missing}'", line)

  def testUnknownOverrideKeyIsOneLineAndDebugShowsTheTraceback(self):
    line = self._OneLineError(self.runs[2], 'UnknownParamError')
    self.assertIn('--model_params_override', line)
    self.assertIn('Did you mean: task.learning_rate_schedule?', line)
    # The child's own exit: status and stderr of the process itself.
    debug = self.runs[3]
    self.assertEqual(debug.returncode, 1)
    self.assertIn('Traceback (most recent call last)', debug.stderr)
    self.assertIn('hyperparams.py', debug.stderr)
    self.assertEqual(debug.stderr.strip().splitlines()[-1], line)
    self.assertFalse(os.path.exists(self.override_dir))


if __name__ == '__main__':
  absltest.main()
