"""Tests of tools/export/fit_digits.py: one short epoch of model.fit on a pipelined AmoebaNet, run as a script."""

import os
import re
import subprocess
import sys
import tempfile

import tensorflow as tf

import test_utils


class FitDigitsTest(tf.test.TestCase):

  def testOneShortEpochPrintsTheValidationAccuracy(self):
    root = tempfile.mkdtemp()
    logdir = os.path.join(root, 'logs')
    run = subprocess.run(
        [sys.executable, '-m', 'tools.export.fit_digits', '--epochs=1',
         '--steps_per_epoch=3', '--normal_cells=1', '--filters=8',
         # M=2 traces half the micro-batch steps of the default 4 (35 s
         # instead of 50 s for the script).
         '--micro_batches=2', '--batch_size=16',
         f'--data_dir={root}/tfds', f'--logdir={logdir}'],
        cwd=test_utils.REPO_ROOT, capture_output=True, text=True, timeout=300,
        check=False, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    match = re.search(r'^Validation accuracy after 1 epochs: (\d\.\d{4})$',
                      run.stdout, re.MULTILINE)
    self.assertIsNotNone(match, run.stdout)
    self.assertBetween(float(match[1]), 0.0, 1.0)
    # Keras's progress line: 3 steps of the pipelined model, then validation.
    self.assertRegex(run.stdout + run.stderr,
                     r'3/3 - .*accuracy: .* - loss: .* - val_accuracy: ')
    self.assertIn("balance [", run.stderr)
    self.assertIn("['/device:CPU:0', '/device:CPU:1'], schedule 1f1b",
                  run.stderr)
    self.assertTrue(os.path.exists(os.path.join(logdir,
                                                'epoch1.weights.h5')))
    self.assertNotEmpty(tf.io.gfile.glob(os.path.join(
        logdir, 'validation', 'events.out.tfevents.*')))
    self.assertNotIn('ran out of data', run.stderr)


if __name__ == '__main__':
  tf.test.main()
