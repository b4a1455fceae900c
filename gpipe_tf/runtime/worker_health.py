"""Whether a pipeline cluster's workers are alive: health checks with deadlines, and failures said in one line.

TensorFlow's remote calls have no deadline, so a worker that is stopped or
unreachable would hang the trainer. This module asks each worker's server
directly over gRPC, with a deadline:

  WaitForWorkers  bounds the start-up: returns once every worker answers,
                  else names the ones that did not and how to start them;
  ProbeWorker     one health check of one worker;
  WorkerMonitor   probes every worker from a background thread and reports
                  the first that is dead or silent;
  ErrorSummary, FailureMessage
                  the one line a trainer prints when a worker is lost.

The cluster itself (its description, where cells go, connecting) is
gpipe_tf.runtime.pipeline_cluster's.
"""

from __future__ import annotations

import re
import threading
import time
from typing import TYPE_CHECKING, Callable

import grpc

from gpipe_tf import errors

__all__ = ['ErrorSummary', 'FailureMessage', 'ProbeWorker', 'WaitForWorkers',
           'WorkerMonitor', 'WorkerUnreachableError']

if TYPE_CHECKING:
  from gpipe_tf.runtime.pipeline_cluster import PipelineCluster


class WorkerUnreachableError(errors.Error, ConnectionError):
  """A worker task did not answer while connecting."""


def _Ask(address: str, timeout_seconds: float) -> str | None:
  """None if a TensorFlow server answers at `address` in time, else why not.

  A gRPC WorkerService.GetStatus call with a deadline, made with the grpcio
  package (a TensorFlow dependency), not through TensorFlow: TensorFlow's
  own health check (context.check_alive) has no deadline and holds the GIL
  while it waits, so it would freeze every Python thread.
  """
  with grpc.insecure_channel(address) as channel:
    call = channel.unary_unary('/tensorflow.WorkerService/GetStatus')
    try:
      call(b'', timeout=timeout_seconds)
      return None
    except grpc.RpcError as e:
      code, details = e.code(), str(e.details())  # pylint: disable=no-member
  if code == grpc.StatusCode.UNAVAILABLE:  # E.g. 'Connection refused'.
    reason = re.sub(r'^.*?last error: (\w+: )?(ipv[46]:\S+: )?', '',
                    details)[:100]
    return f'cannot be reached at {address} ({reason})'
  if code == grpc.StatusCode.DEADLINE_EXCEEDED:
    return (f'did not answer a health check within {timeout_seconds:g} s '
            '(stopped, overloaded or cut off?)')
  return f'answers at {address} but is not a TensorFlow server ({code.name})'


def WaitForWorkers(cluster: PipelineCluster, timeout_seconds: float) -> None:
  """Returns once every worker's server answers; waits at most the timeout.

  Raises:
    WorkerUnreachableError: naming the workers that did not, and the command
      that starts each.
  """
  deadline = time.monotonic() + timeout_seconds
  waiting = {i: '' for i in range(len(cluster.workers))}
  while waiting:
    waiting = {i: why for i in waiting
               if (why := _Ask(cluster.workers[i], 2.0)) is not None}
    if not waiting:
      return
    if time.monotonic() >= deadline:
      raise WorkerUnreachableError(
          '; '.join(f'{cluster.Describe(i)} {why}' for i, why in
                    waiting.items()) + f' (waited {timeout_seconds:g} s). '
          'Start ' + ('it' if len(waiting) == 1 else 'each') + ' on its host ('
          + '; '.join(cluster.ServeCommand(i) for i in waiting)
          + '), or fix the address.')
    time.sleep(0.25)


def ErrorSummary(error: BaseException) -> str:
  """'UnavailableError: <its first informative line>', at most 200 characters."""
  skip = ('Graph execution error', 'Detected at node', 'Additional GRPC error',
          '<stack traces unavailable>', 'File "')
  lines = [l.strip() for l in str(error).splitlines()]
  line = next((l for l in lines if l and not l.startswith(skip)), '')
  line = re.sub(r'\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\]', '', line)
  return f'{type(error).__name__}: {line}'[:200]


def ProbeWorker(cluster: PipelineCluster, index: int,
                timeout_seconds: float) -> str | None:
  """None if worker `index` answers a health check in time, else why not."""
  return _Ask(cluster.workers[index], timeout_seconds)


def FailureMessage(cluster: PipelineCluster, index: int | None, what: str,
                   newest_checkpoint: str | None) -> str:
  """One line: which worker failed, and how to restart the run."""
  if index is None:
    who = f'a pipeline worker of {list(cluster.workers)}'
    restart = 'restart the workers that are down'
  else:
    who = f'pipeline {cluster.Describe(index)}'
    restart = f'restart it on its host ({cluster.ServeCommand(index)})'
  return ' '.join(
      f'{who} {what}. The run cannot go on without it: {restart}, then rerun '
      'this trainer command; training resumes from the newest checkpoint '
      f'({newest_checkpoint or "none yet"}).'.split())


class WorkerMonitor:
  """Probes every worker from a daemon thread; reports the first failure once.

  Every `interval_seconds` each worker gets a health check (``ProbeWorker``)
  that must answer within `timeout_seconds`. A worker whose process died is
  reported at the next probe (it refuses connections); one that is stopped,
  overloaded or behind a broken network after `timeout_seconds`. The
  callback gets (worker index, reason) and is called at most once, from the
  monitor's thread: the main thread may be blocked inside TensorFlow, so the
  callback must end the process itself (the trainer prints one line and
  exits) or otherwise act without it.

  It does not restart anything, and it does not tell a slow step from a hung
  one: only the workers' answers count.
  """

  def __init__(self, cluster: PipelineCluster,
               on_failure: Callable[[int, str], None],
               interval_seconds: float = 2.0,
               timeout_seconds: float = 30.0) -> None:
    if interval_seconds <= 0 or timeout_seconds <= 0:
      raise ValueError('interval_seconds and timeout_seconds must be > 0, got '
                       f'{interval_seconds} and {timeout_seconds}.')
    self._cluster = cluster
    self._on_failure = on_failure
    self._interval = interval_seconds
    self._timeout = timeout_seconds
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._Run, daemon=True,
                                    name='WorkerMonitor')

  def Start(self) -> WorkerMonitor:
    self._thread.start()
    return self

  def Stop(self) -> None:
    self._stop.set()

  def __enter__(self) -> WorkerMonitor:
    return self.Start()

  def __exit__(self, *unused) -> None:
    self.Stop()

  def _Run(self) -> None:
    while not self._stop.wait(self._interval):
      for index in range(len(self._cluster.workers)):
        reason = ProbeWorker(self._cluster, index, self._timeout)
        if reason is not None and not self._stop.is_set():
          self._stop.set()
          self._on_failure(index, reason)
          return
