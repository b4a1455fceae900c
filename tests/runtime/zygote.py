"""Zygote: test processes forked from one process that has imported TensorFlow.

Shared by tests/runtime/multi_worker_test.py (the trainer tasks) and
pipeline_cluster_test.py (workers, chief and trainers).
"""

import json
import os
import signal
import subprocess
import sys
import threading

import test_utils

_REPO_ROOT = test_utils.REPO_ROOT
CLOSE_TIMEOUT = 180  # Seconds for the processes to end once the zygote closes.


# The processes of a test (here the trainer tasks; pipeline_cluster_test's
# workers, chief and trainers too) are forked from one process that has
# imported TensorFlow (an import costs ~8 s of CPU a process) and run no op:
# each is a fresh process running `python -m MODULE ARGS` (runpy, as -m
# does) or `python -c CODE ARGS` with its own environment (PYTHONPATH on
# sys.path), stdout and stderr, signalled, killed and restarted as a
# process. The zygote reaps them and reports each one's exit status (their
# CPU reaches the test's process through it); it exits when its stdin
# closes and its processes have ended.
_ZYGOTE = """
import json, os, runpy, select, sys, time, traceback
import tensorflow  # What each process imports first.
from tensorflow.python.eager import context
assert context.context()._context_handle is None  # No op ran: fork-safe.
out = sys.stdout
children, closed, pending = set(), False, b''


def Run(argv, env):
  os.environ.clear()
  os.environ.update(env)
  paths = [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]
  sys.path[1:1] = [os.path.abspath(p) for p in paths]
  _, flag, what, *args = argv  # python -m MODULE ARGS | -c CODE ARGS
  if flag == '-m':
    sys.argv = [what, *args]  # run_module sets argv[0] as -m does.
    runpy.run_module(what, run_name='__main__', alter_sys=True)
  else:
    assert flag == '-c', argv
    sys.argv = ['-c', *args]
    exec(compile(what, '<string>', 'exec'), {'__name__': '__main__'})


while children or not closed:
  while children:
    try:
      pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      break
    if not pid:
      break
    children.discard(pid)
    out.write(f'exit {pid} {os.waitstatus_to_exitcode(status)}\\n')
    out.flush()
  if closed:
    time.sleep(0.05)
    continue
  if not select.select([0], [], [], 0.05)[0]:
    continue
  chunk = os.read(0, 65536)
  closed = not chunk
  pending += chunk
  while b'\\n' in pending:
    line, pending = pending.split(b'\\n', 1)
    child = json.loads(line)
    pid = os.fork()
    if pid:
      children.add(pid)
      out.write(f'started {pid}\\n')
      out.flush()
      continue
    code = 1
    try:
      log = os.open(child['log'], os.O_WRONLY | os.O_APPEND)
      os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
      os.dup2(log, 1)
      os.dup2(log, 2)
      try:
        Run(child['argv'], child['env'])
        code = 0
      except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
          code = e.code or 0
        else:
          print(e.code, file=sys.stderr)
      except BaseException:
        traceback.print_exc()
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(code)
"""


class Zygote:
  """A _ZYGOTE process; Close() waits for it (at `test`'s cleanup if given)."""

  def __init__(self, test=None):
    self._process = subprocess.Popen(
        [sys.executable, '-c', _ZYGOTE], cwd=_REPO_ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    self._changed = threading.Condition()
    self._started = []
    self._ended = False
    self.exits = {}  # pid: exit status (-N: killed by signal N).
    threading.Thread(target=self._Read, daemon=True).start()
    if test is not None:
      test.addCleanup(self.Close)

  def _Read(self):
    for line in self._process.stdout:
      what, pid, *code = line.decode().split()
      with self._changed:
        if what == 'started':
          self._started.append(int(pid))
        else:
          self.exits[int(pid)] = int(code[0])
        self._changed.notify_all()
    with self._changed:
      self._ended = True
      self._changed.notify_all()

  def Start(self, argv, env, log):
    """Forks `argv` (python -m MODULE ARGS or -c CODE ARGS) with `env`, its
    stdout and stderr appended to the file `log`; returns a Popen-like
    ForkedProcess."""
    with self._changed:
      self._process.stdin.write(json.dumps(
          {'argv': argv, 'env': env, 'log': log}).encode() + b'\n')
      self._process.stdin.flush()
      self._changed.wait_for(lambda: self._started or self._ended, 60)
      if not self._started:
        raise AssertionError('The zygote did not fork.')
      return ForkedProcess(self, self._started.pop(0))

  def Wait(self, pid, timeout):
    with self._changed:
      if not self._changed.wait_for(
          lambda: pid in self.exits or self._ended, timeout):
        raise subprocess.TimeoutExpired(f'process {pid}', timeout)
      if pid not in self.exits:
        raise AssertionError(f'The zygote ended before process {pid}.')
      return self.exits[pid]

  def Close(self):
    if self._process.stdin.closed:
      return
    self._process.stdin.close()
    self._process.wait(CLOSE_TIMEOUT)


class ForkedProcess:
  """A process Zygote forked, with the Popen methods the tests use."""

  def __init__(self, zygote, pid):
    self._zygote = zygote
    self.pid = pid

  def poll(self):
    return self._zygote.exits.get(self.pid)

  def wait(self, timeout=None):
    return self._zygote.Wait(self.pid, timeout)

  def send_signal(self, sig):
    if self.poll() is None:
      os.kill(self.pid, sig)

  def kill(self):
    self.send_signal(signal.SIGKILL)
