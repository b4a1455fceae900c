"""Worker health checks with deadlines, the background monitor and the one-line failure messages (no TensorFlow server needed)."""

import json
import socket
import threading
import time

import test_utils  # pylint: disable=g-bad-import-order

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.runtime import pipeline_cluster
from gpipe_tf.runtime import worker_health


def _Cluster(*workers):
  return pipeline_cluster.ParseCluster(json.dumps(
      {'chief': ['trainer:2222'], 'worker': list(workers)}))


def _Closed():
  """'localhost:P' where nothing listens."""
  return f'localhost:{test_utils.FreePorts(1)[0]}'


class _SilentListener:
  """Accepts TCP connections and never answers (a stopped server)."""

  def __init__(self):
    self.socket = socket.socket()
    self.socket.bind(('localhost', 0))
    self.socket.listen(8)
    self.address = f'localhost:{self.socket.getsockname()[1]}'

  def Close(self):
    self.socket.close()


class MessagesTest(tf.test.TestCase):

  def testErrorSummaryKeepsTheFirstInformativeLine(self):
    by_task = tf.errors.UnavailableError(
        None, None, 'Graph execution error:\n\nrecvmsg:Connection reset by '
        'peer\nAdditional GRPC error information from remote target '
        '/job:worker/replica:0/task:1/device:CPU:0 while calling x')
    self.assertEqual(worker_health.ErrorSummary(by_task),
                     'UnavailableError: recvmsg:Connection reset by peer')
    self.assertEqual(worker_health.ErrorSummary(
        tf.errors.UnavailableError(None, None, 'Graph execution error:\n\n'
                                   '<stack traces unavailable>\nSocket closed'
                                   '\n\t [[{{node x}}]] [Op:__inference_f_7]')),
                     'UnavailableError: Socket closed')

  def testFailureMessageIsOneLineSayingHowToRestart(self):
    cluster = _Cluster('h0:2222', 'h1:2223')
    message = worker_health.FailureMessage(cluster, 1, 'died',
                                           '/logs/ckpt/ckpt-4')
    self.assertNotIn('\n', message)
    for part in ('worker 1 (/job:worker/replica:0/task:1 at h1:2223) died',
                 'python -m gpipe_tf.runtime.serve_worker --cluster=',
                 '--task_index=1', 'rerun this trainer command',
                 '/logs/ckpt/ckpt-4'):
      self.assertIn(part, message)
    unknown = worker_health.FailureMessage(cluster, None, 'hung up', None)
    self.assertIn("a pipeline worker of ['h0:2222', 'h1:2223'] hung up",
                  unknown)
    self.assertIn('none yet', unknown)


class HealthCheckTest(tf.test.TestCase):

  def testClosedPortCannotBeReached(self):
    address = _Closed()
    why = worker_health.ProbeWorker(_Cluster(address), 0, 2.0)
    self.assertStartsWith(why, f'cannot be reached at {address}')

  def testSilentServerMissesItsDeadline(self):
    listener = _SilentListener()
    try:
      start = time.monotonic()
      why = worker_health.ProbeWorker(_Cluster(listener.address), 0, 0.5)
      self.assertLess(time.monotonic() - start, 10.0)
    finally:
      listener.Close()
    self.assertIsNotNone(why)
    self.assertNotStartsWith(why, 'answers')

  def testWaitForWorkersNamesTheMissingOnesWithinItsTimeout(self):
    address = _Closed()
    cluster = _Cluster(address)
    start = time.monotonic()
    with self.assertRaisesRegex(
        worker_health.WorkerUnreachableError,
        r'worker 0 .* cannot be reached .*waited 1 s.*'
        r'python -m gpipe_tf\.runtime\.serve_worker'):
      worker_health.WaitForWorkers(cluster, 1.0)
    self.assertLess(time.monotonic() - start, 10.0)


class WorkerMonitorTest(tf.test.TestCase):

  def testReportsTheFirstDeadWorkerOnce(self):
    reports, reported = [], threading.Event()

    def _OnFailure(index, why):
      reports.append((index, why))
      reported.set()

    cluster = _Cluster(_Closed(), _Closed())
    with worker_health.WorkerMonitor(cluster, _OnFailure,
                                     interval_seconds=0.05,
                                     timeout_seconds=1.0):
      self.assertTrue(reported.wait(10.0))
      time.sleep(0.3)  # Further probes would report again; they must not.
    self.assertLen(reports, 1)
    self.assertEqual(reports[0][0], 0)
    self.assertStartsWith(reports[0][1], 'cannot be reached')

  def testIntervalAndTimeoutMustBePositive(self):
    with self.assertRaisesRegex(ValueError, 'must be > 0'):
      worker_health.WorkerMonitor(_Cluster(_Closed()), lambda *_: None,
                                  interval_seconds=0)


if __name__ == '__main__':
  tf.test.main()
