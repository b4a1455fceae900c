"""tools/trace/cost.py: every mode builds and runs a real step; the loop's graph does not grow with M."""

import os
import re
import shutil
import subprocess
import sys
import tempfile

import test_utils  # pylint: disable=g-bad-import-order

import pytest  # pylint: disable=g-import-not-at-top,g-bad-import-order
import tensorflow as tf  # pylint: disable=g-import-not-at-top

# 1F1B, not the tool's default GPipe: its steps trace fewer ops (1005 and
# 1561 unrolled at M=2 and 4, against 1154 and 1743), ~4 s less CPU; what the
# test checks holds for any schedule.
_TINY = ['--partitions=2', '--micro_batches=2,4', '--num_blocks=2', '--dim=8',
         '--seq_len=4', '--batch_size=16', '--steps=1', '--warmup=0',
         '--loop_budget=0', '--schedule=1f1b']

# One child (a child costs ~8 s of CPU to import TensorFlow) runs the tool's
# entry point, app.run(cost.main) as `python -m tools.trace.cost` does, twice
# (tests/entry_point.py): first with an unknown mode, its stderr and exit
# status written to the file argv[1], the status on the last line; then the
# tiny run, which ends the child (its stdout and exit status are the
# process's own).
_DRIVER = r'''
import sys
from absl import app, flags
from tools.trace import cost
import entry_point

tiny = sys.argv[2:]
status, err = entry_point.RunCapturingStderr(
    cost.main, ['cost', '--modes=fast'] + tiny)
with open(sys.argv[1], 'w') as f:
  f.write(f'{err}\n{status}\n')
flags.FLAGS.unparse_flags()
app.run(cost.main, argv=['cost'] + tiny)
'''


# One worker runs the whole class, so its one child (setUpClass) runs once
# under `pytest -n 2 --dist loadgroup`.
@pytest.mark.xdist_group('trace_cost_test')
class TraceCostTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.usage_file = os.path.join(cls.root, 'usage.txt')
    cls.tiny = subprocess.run(
        [sys.executable, '-c', _DRIVER, cls.usage_file, *_TINY],
        cwd=test_utils.REPO_ROOT, capture_output=True, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
                 PYTHONPATH=test_utils.CHILD_PYTHONPATH))

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def testTinyRunPrintsEveryModeAndRatio(self):
    self.assertEqual(self.tiny.returncode, 0, self.tiny.stderr[-3000:])
    out = self.tiny.stdout
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
    with open(self.usage_file) as f:
      stderr, status = f.read().rstrip('\n').rsplit('\n', 1)
    self.assertNotEqual(int(status), 0)
    self.assertIn("unknown mode 'fast'", stderr)


if __name__ == '__main__':
  tf.test.main()
