"""The README's example runs as written, and CI runs the README's test command."""

import os
import re
import subprocess
import sys

import test_utils  # pylint: disable=g-bad-import-order,unused-import

import tensorflow as tf  # pylint: disable=g-import-not-at-top

_ROOT = test_utils.REPO_ROOT


def _Readme():
  with open(os.path.join(_ROOT, 'README.md')) as f:
    return f.read()


class ReadmeTest(tf.test.TestCase):

  def testExampleRuns(self):
    section = _Readme().split('## A pipelined model in 15 lines', 1)[1]
    code = re.search(r'```python\n(.*?)```', section, re.S).group(1)
    self.assertLessEqual(len([l for l in code.splitlines() if l.strip()]),
                         25)
    env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL='2')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, env=env, timeout=300, cwd=_ROOT,
                         check=False)
    self.assertEqual(out.returncode, 0, out.stderr[-2000:])
    lines = out.stdout.strip().splitlines()
    self.assertEqual(lines[0], "[4, 4] ['/device:CPU:0', '/device:CPU:1']")
    self.assertAllClose(float(lines[1]), 2.3, atol=0.5)

  def testCiRunsTheReadmeTestCommand(self):
    quick = _Readme().split('## Quick start', 1)[1].split('##', 1)[0]
    commands = [l for l in re.search(r'```sh\n(.*?)```', quick, re.S).group(
        1).splitlines() if l and not l.startswith('#')]
    # 1. train, 2. the test command, 3. export.
    self.assertLen(commands, 3)
    self.assertIn('pytest', commands[1])
    with open(os.path.join(_ROOT, '.ci', 'run')) as f:
      ci = f.read()
    self.assertIn(commands[1], ci)


if __name__ == '__main__':
  tf.test.main()
