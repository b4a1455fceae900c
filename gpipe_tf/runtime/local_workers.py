"""Local worker processes that stand in for accelerators: one serve_worker per device, pinned to its own core.

On a CPU host the logical devices of one process share one thread pool and
one allocator (gpipe_tf.runtime.devices), so a device that waits leaves no
core idle and a schedule's bubble costs nothing. ``LocalWorkers`` starts K
``gpipe_tf.runtime.serve_worker`` processes on free localhost ports instead,
worker k pinned to core k (round-robin when K > cores) with one intra-op
thread: each device runs its ops one after another on a core of its own, as
an accelerator does, holds its own allocator, and sends what crosses a cell
boundary over gRPC. This process becomes the cluster's chief
(pipeline_cluster.ConnectToCluster), so it must start the workers before
TensorFlow runs any op::

  with local_workers.LocalWorkers(local_workers.Options(num_workers=2)) as w:
    devices = w.Connect()            # cell k on worker k's CPU:0
    ... build and run the pipeline on `devices` ...
    w.CpuSeconds(), w.Memory(), w.BytesSent()   # per worker

The workers stop when the ``with`` block ends, by an exception, by Ctrl-C,
or when this process dies however it dies (they are started with a parent
death signal), so no worker outlives the run.

What it does NOT do: place anything on the workers itself, or start workers
on other hosts (docs/cross-host.md).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from gpipe_tf import errors

__all__ = ['LocalWorkersError', 'Options', 'LocalWorkers', 'CoreOf',
           'FreePorts', 'SharesCores']

_SERVING = 'is serving devices'
# How a serve_worker --stats_on_stdin prefixes its answers.
STATS_PREFIX = 'serve_worker: stats '
_PR_SET_PDEATHSIG = 1


class LocalWorkersError(errors.Error, RuntimeError):
  """A local worker did not start, or died, or did not answer."""


@dataclasses.dataclass(frozen=True)
class Options:
  """How many workers and how each runs.

  Attributes:
    num_workers: K, one device (one cell) each.
    intra_op_threads: threads one op may use on a worker; 1 runs a device's
      ops one after another.
    inter_op_threads: ops a worker may run at once (its sends and receives
      run beside its compute); applied through the chief's configuration
      by Connect.
    pin: pin worker k to core CoreOf(k); False leaves the OS to place them.
    start_timeout_seconds: how long a worker may take to serve.
  """
  num_workers: int = 2
  intra_op_threads: int = 1
  inter_op_threads: int = 2
  pin: bool = True
  start_timeout_seconds: float = 120.0


def Cores() -> list[int]:
  """The cores this process may run on."""
  return sorted(os.sched_getaffinity(0))


def CoreOf(index: int, cores: Sequence[int]) -> int:
  """Pure: worker `index`'s core, round-robin over `cores`."""
  return cores[index % len(cores)]


def SharesCores(num_workers: int, cores: Sequence[int]) -> bool:
  """Pure: whether K workers pinned round-robin must share cores."""
  return num_workers > len(cores)


def FreePorts(n: int) -> list[int]:
  """n distinct free localhost ports (bound to port 0, then released)."""
  sockets = [socket.socket() for _ in range(n)]
  try:
    for s in sockets:
      s.bind(('localhost', 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def _DieWithParent() -> None:
  """Runs in the child before exec: SIGKILL it when its parent dies."""
  libc = ctypes.CDLL(None, use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class LocalWorkers:
  """K serve_worker processes on localhost, started on enter, killed on exit.

  Attributes (after enter):
    cluster: the PipelineCluster (this process is its chief).
    pids: the workers' process ids.
    cores: worker k's core, or None when not pinned.
  """

  def __init__(self, options: Options = Options(),
               log_dir: str | None = None) -> None:
    if options.num_workers < 1:
      raise LocalWorkersError(
          f'num_workers must be >= 1, got {options.num_workers}.')
    self.options = options
    self._log_dir = log_dir
    self._processes: list[subprocess.Popen] = []
    self._logs: list[str] = []
    self.cluster = None
    self.pids: list[int] = []
    self.cores: list[int | None] = []

  def __enter__(self) -> 'LocalWorkers':
    try:
      self._Start()
    except BaseException:
      self.Stop()
      raise
    return self

  def __exit__(self, *exc_info) -> None:
    self.Stop()

  def _Start(self) -> None:
    from gpipe_tf.runtime import pipeline_cluster  # pylint: disable=g-import-not-at-top
    k = self.options.num_workers
    ports = FreePorts(k + 1)
    self.cluster = pipeline_cluster.PipelineCluster(
        f'localhost:{ports[0]}', tuple(f'localhost:{p}' for p in ports[1:]))
    log_dir = self._log_dir or tempfile.mkdtemp(prefix='local_workers_')
    cores = Cores()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
               PYTHONPATH=os.pathsep.join(
                   [_RepoRoot()] + [p for p in [os.environ.get('PYTHONPATH')]
                                    if p]))
    for i in range(k):
      core = CoreOf(i, cores) if self.options.pin else None
      command = [sys.executable, '-m', 'gpipe_tf.runtime.serve_worker',
                 f'--cluster={self.cluster.AsJson()}', f'--task_index={i}',
                 f'--intra_op_threads={self.options.intra_op_threads}',
                 f'--inter_op_threads={self.options.inter_op_threads}',
                 '--stats_on_stdin']
      if core is not None:
        command.append(f'--cpu_cores={core}')
      self._logs.append(os.path.join(log_dir, f'worker{i}.log'))
      with open(self._logs[i], 'w') as log:
        self._processes.append(subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log, text=True, env=env, preexec_fn=_DieWithParent))
      self.pids.append(self._processes[i].pid)
      self.cores.append(core)
    deadline = time.monotonic() + self.options.start_timeout_seconds
    for i, process in enumerate(self._processes):
      self._ReadLine(i, _SERVING, deadline)

  def _ReadLine(self, index: int, marker: str, deadline: float) -> str:
    """The next stdout line of worker `index` that holds `marker`."""
    process = self._processes[index]
    while True:
      line = process.stdout.readline()
      if marker in line:
        return line
      if not line or time.monotonic() > deadline:
        process.poll()
        raise LocalWorkersError(
            f'Local worker {index} (pid {process.pid}) did not '
            f"{'serve' if marker == _SERVING else 'answer'} "
            f'(exit code {process.returncode}); its log {self._logs[index]} '
            f'ends: {_Tail(self._logs[index])}')

  def Connect(self, timeout_seconds: float = 60.0) -> list[str]:
    """Makes this process the chief; returns worker k's device for cell k.

    Must run before TensorFlow runs any op in this process. Each worker then
    runs this process's ops on `options.inter_op_threads` threads (the
    chief's setting decides that, not the worker's:
    pipeline_cluster.ConnectToCluster).
    """
    from gpipe_tf.runtime import pipeline_cluster  # pylint: disable=g-import-not-at-top
    pipeline_cluster.ConnectToCluster(
        self.cluster, timeout_seconds,
        worker_inter_op_threads=self.options.inter_op_threads)
    return pipeline_cluster.PipelineDevices(self.options.num_workers,
                                            self.cluster)

  def Describe(self) -> str:
    """One line: how many workers, their cores and threads."""
    o = self.options
    where = (', '.join(f'worker {i} on core {c}' for i, c in
                       enumerate(self.cores)) if o.pin else 'not pinned')
    shared = (f'; {o.num_workers} workers share {len(Cores())} cores '
              'round-robin' if o.pin and SharesCores(o.num_workers, Cores())
              else '')
    return (f'{o.num_workers} local worker processes ({where}{shared}), '
            f'{o.intra_op_threads} intra-op and {o.inter_op_threads} '
            'inter-op threads each')

  def CpuSeconds(self) -> list[float]:
    """Each worker's CPU time so far (user + system, all its threads)."""
    ticks = os.sysconf('SC_CLK_TCK')
    out = []
    for pid in self.pids:
      with open(f'/proc/{pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
      out.append((int(fields[11]) + int(fields[12])) / ticks)
    return out

  def Memory(self, reset: bool = False) -> list[dict[str, int]]:
    """Each worker's allocator {'current', 'peak'} bytes; `reset` then
    restarts every peak from the current use."""
    deadline = time.monotonic() + 30
    for process in self._processes:
      process.stdin.write('reset\n' if reset else 'memory\n')
      process.stdin.flush()
    return [json.loads(self._ReadLine(i, STATS_PREFIX, deadline)
                       .split(STATS_PREFIX, 1)[1])
            for i in range(len(self._processes))]

  def BytesSent(self) -> list[int]:
    """Each worker's bytes sent so far over its open TCP connections.

    Read from the kernel's per-socket counters (``ss -tin``): what a worker
    sent to the chief and to the other workers, gRPC framing included.

    Raises:
      LocalWorkersError: ``ss`` (iproute2) is not installed.
    """
    try:
      text = subprocess.run(['ss', '-tinpH'], capture_output=True, text=True,
                            check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
      raise LocalWorkersError(
          f'Cannot read socket counters with ss ({e}); install iproute2.'
      ) from e
    return SocketBytesSent(text, self.pids)

  def Stop(self) -> None:
    """Kills every worker still running and waits for it (idempotent)."""
    for process in self._processes:
      if process.poll() is None:
        process.send_signal(signal.SIGCONT)  # A stopped one dies too.
        process.kill()
    for process in self._processes:
      process.wait()
      for stream in (process.stdin, process.stdout):
        if stream is not None:
          try:
            stream.close()
          except OSError:
            pass


def SocketBytesSent(ss_output: str, pids: Sequence[int]) -> list[int]:
  """Pure: per pid, the sum of bytes_sent over its sockets in `ss -tinpH`.

  ``ss`` prints a socket's owner line (``users:(("python",pid=12,fd=5))``)
  and then its counters on the next line.
  """
  totals = {pid: 0 for pid in pids}
  owner = None
  for line in ss_output.splitlines():
    if line and not line[0].isspace():  # A socket's first line.
      found = re.findall(r'pid=(\d+)', line)
      owner = int(found[0]) if found else None
    sent = re.search(r'\bbytes_sent:(\d+)', line)
    if sent and owner in totals:
      totals[owner] += int(sent.group(1))
  return [totals[pid] for pid in pids]


def _RepoRoot() -> str:
  """The directory that holds this gpipe_tf package."""
  return os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))


def _Tail(path: str, chars: int = 1500) -> str:
  try:
    with open(path, errors='replace') as f:
      return f.read()[-chars:].strip() or '(empty)'
  except OSError:
    return '(unreadable)'
