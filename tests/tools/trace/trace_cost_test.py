"""tools/trace/cost.py: every mode builds and runs a real step; the loop's graph does not grow with M."""

import os
import re
import subprocess
import sys

import test_utils  # pylint: disable=g-bad-import-order

import tensorflow as tf  # pylint: disable=g-import-not-at-top


class TraceCostTest(tf.test.TestCase):

  def testTinyRunPrintsEveryModeAndRatio(self):
    out = subprocess.run(
        [sys.executable, '-m', 'tools.trace.cost', '--partitions=2',
         '--micro_batches=2,4', '--num_blocks=2', '--dim=8', '--seq_len=4',
         '--batch_size=16', '--steps=1', '--warmup=0', '--loop_budget=0'],
        cwd=test_utils.REPO_ROOT, capture_output=True, text=True, check=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')).stdout
    rows = re.findall(
        r'^\| (\d+) \| (\w+) \| [\d.]+ \| [\d.]+ \| \d+ \| (\d+) \| \d+ \|$',
        out, re.MULTILINE)
    ops = {(int(m), mode): int(n) for m, mode, n in rows}
    self.assertCountEqual(ops, [(m, mode) for m in (2, 4) for mode in
                                ('unrolled', 'loop')])
    # With no budget (every program one switch loop) the loop's graph holds
    # as much at any M.
    self.assertEqual(ops[(2, 'loop')], ops[(4, 'loop')])
    self.assertGreater(ops[(4, 'unrolled')], ops[(2, 'unrolled')])
    for mode in ('unrolled', 'loop'):
      self.assertIn(f'{mode}: first step at M=4 / M=2:', out)
    self.assertIn('M=2: steady step / unrolled: loop', out)
    self.assertIn('M=2: CPU per step / unrolled: loop', out)

  def testUnknownModeIsAUsageError(self):
    run = subprocess.run(
        [sys.executable, '-m', 'tools.trace.cost', '--modes=fast'],
        cwd=test_utils.REPO_ROOT, capture_output=True, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    self.assertNotEqual(run.returncode, 0)
    self.assertIn("unknown mode 'fast'", run.stderr)


if __name__ == '__main__':
  tf.test.main()
