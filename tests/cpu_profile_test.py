"""Tests for tests/cpu_profile.py: per-test CPU, its own and its subprocesses'."""

import os
import subprocess
import sys
import tempfile
import textwrap

import cpu_profile
import tensorflow as tf

_TESTS = textwrap.dedent('''
    import subprocess, sys, time

    def _Burn(seconds):
      end = time.process_time() + seconds
      while time.process_time() < end:
        pass

    def test_burns():
      _Burn(0.6)

    def test_child_burns():
      subprocess.run([sys.executable, '-c',
                      'import time\\nend = time.process_time() + 0.6\\n'
                      'while time.process_time() < end: pass'], check=True)

    def test_sleeps():
      time.sleep(0.4)
''')


class CpuProfileTest(tf.test.TestCase):

  def testOwnChildrenAndWallSecondsPerTest(self):
    with tempfile.TemporaryDirectory() as root:
      with open(os.path.join(root, 'burn_test.py'), 'w') as f:
        f.write(_TESTS)
      out = os.path.join(root, 'cpu')
      here = os.path.dirname(os.path.abspath(__file__))
      # Not an xdist worker's child: its rows go to main.tsv.
      env = {k: v for k, v in os.environ.items()
             if not k.startswith('PYTEST_')}
      env['PYTHONPATH'] = here
      subprocess.run(
          [sys.executable, '-m', 'pytest', '-q', '-p', 'cpu_profile',
           '--cpu_profile', out, '-p', 'no:cacheprovider', '-p', 'no:xdist',
           '--rootdir', root, 'burn_test.py'],
          cwd=root, check=True, capture_output=True,
          env=env)
      with open(os.path.join(out, 'main.tsv')) as f:
        rows = {line.split('\t')[3].strip().split('::')[1]:
                [float(x) for x in line.split('\t')[:3]] for line in f}
      own, children, wall = rows['test_burns']
      self.assertGreater(own, 0.5)
      self.assertLess(children, 0.1)
      own, children, wall = rows['test_child_burns']
      self.assertGreater(children, 0.5)
      self.assertLess(own, 0.3)
      own, children, wall = rows['test_sleeps']
      self.assertLess(own + children, 0.2)
      self.assertGreater(wall, 0.35)
      lines = cpu_profile.Summary(out)
      self.assertEqual(len(lines), 2)  # One file, then the total.
      self.assertIn('burn_test.py', lines[0])
      self.assertGreater(float(lines[0].split()[0]), 1.0)
      self.assertEqual(len(cpu_profile.Summary(out, by_test=True)), 4)


if __name__ == '__main__':
  tf.test.main()
