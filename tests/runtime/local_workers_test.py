"""LocalWorkers: workers start pinned and answer for their memory; none outlives the run (exception, SIGKILL of the parent)."""

import os
import signal
import subprocess
import sys
import time

import tensorflow as tf

from gpipe_tf import errors
from gpipe_tf.runtime import local_workers

_PARENT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       'local_workers_parent.py')
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
GONE_WITHIN = 20  # Seconds for a killed worker to be reaped.


def _Alive(pid):
  """Whether `pid` runs (a zombie, dead but not reaped, counts as gone)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


def _WaitGone(test, pids):
  deadline = time.time() + GONE_WITHIN
  while any(_Alive(p) for p in pids) and time.time() < deadline:
    time.sleep(0.1)
  test.assertEqual([p for p in pids if _Alive(p)], [])


def _AssertPinned(test, pids):
  """Worker i of `pids` runs on CoreOf(i) of this process's cores alone."""
  cores = sorted(os.sched_getaffinity(0))
  for i, pid in enumerate(pids):
    test.assertEqual(os.sched_getaffinity(pid),
                     {local_workers.CoreOf(i, cores)})


def _Kill(pids):
  for pid in pids:
    if _Alive(pid):
      os.kill(pid, signal.SIGKILL)


class PureTest(tf.test.TestCase):

  def testCoresRoundRobin(self):
    self.assertEqual([local_workers.CoreOf(i, [0, 1]) for i in range(5)],
                     [0, 1, 0, 1, 0])
    self.assertFalse(local_workers.SharesCores(2, [0, 1]))
    self.assertTrue(local_workers.SharesCores(3, [0, 1]))

  def testBytesSentPerProcessFromSs(self):
    text = (
        'ESTAB 0 0 127.0.0.1:1 127.0.0.1:2 users:(("python",pid=11,fd=5))\n'
        '\t cubic bytes_sent:100 bytes_acked:101 bytes_received:7\n'
        'ESTAB 0 0 127.0.0.1:3 127.0.0.1:4 users:(("python",pid=12,fd=5))\n'
        '\t cubic bytes_sent:30 bytes_received:9\n'
        'ESTAB 0 0 127.0.0.1:5 127.0.0.1:6 users:(("python",pid=11,fd=6))\n'
        '\t cubic bytes_sent:5 bytes_received:9\n'
        'ESTAB 0 0 127.0.0.1:7 127.0.0.1:8\n'  # No owner shown: not counted.
        '\t cubic bytes_sent:1000 bytes_received:9\n')
    self.assertEqual(local_workers.SocketBytesSent(text, [11, 12, 13]),
                     [105, 30, 0])

  def testNoWorkersIsANamedError(self):
    with self.assertRaisesRegex(errors.Error, 'num_workers must be >= 1'):
      local_workers.LocalWorkers(local_workers.Options(num_workers=0))


class LifecycleTest(tf.test.TestCase):

  def testWorkerIsPinnedAnswersAndStopsOnAnException(self):
    # One worker: each costs a TensorFlow import. Two workers pinned to
    # their round-robin cores: testWorkersDieWithAKilledParent.
    pids = []
    with self.assertRaisesRegex(RuntimeError, 'raised in the with block'):
      with local_workers.LocalWorkers(
          local_workers.Options(num_workers=1)) as workers:
        pids = list(workers.pids)
        self.addCleanup(_Kill, pids)
        self.assertTrue(all(_Alive(p) for p in pids))
        _AssertPinned(self, pids)
        self.assertRegex(workers.Describe(),
                         r'^1 local worker processes \(worker 0 on core \d+\), '
                         r'1 intra-op and 2 inter-op')
        memory = workers.Memory(reset=True)
        self.assertLen(memory, 1)
        for m in memory:
          self.assertGreaterEqual(m['peak'], m['current'])
        self.assertTrue(all(s >= 0 for s in workers.CpuSeconds()))
        raise RuntimeError('raised in the with block')
    self.assertLen(pids, 1)
    _WaitGone(self, pids)

  def testWorkersDieWithAKilledParent(self):
    parent = subprocess.Popen(
        [sys.executable, _PARENT], cwd=_REPO_ROOT, stdout=subprocess.PIPE,
        text=True, env=dict(os.environ, PYTHONPATH=_REPO_ROOT))
    self.addCleanup(lambda: parent.poll() is None and parent.kill())
    line = parent.stdout.readline()
    self.assertTrue(line.startswith('pids '), line)
    pids = [int(p) for p in line.split()[1:]]
    self.addCleanup(_Kill, pids)
    self.assertLen(pids, 2)
    self.assertTrue(all(_Alive(p) for p in pids))
    # The parent inherited this process's cores and pinned its workers.
    _AssertPinned(self, pids)
    parent.send_signal(signal.SIGKILL)  # No cleanup code of its runs.
    parent.wait()
    _WaitGone(self, pids)


if __name__ == '__main__':
  tf.test.main()
