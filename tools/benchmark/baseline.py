"""Times the single-core baseline in a child process of its own, one round whenever the benchmark asks.

The baseline is a plain SequentialLayer on one device with ONE thread in
total (intra-op = inter-op = 1): what one core does. TensorFlow fixes its
thread pools for the life of a process at start-up, and the benchmark's
process has already split the CPU into devices with their own threads, so the
baseline runs in a child, ``python -m tools.benchmark --single_core_baseline``
with the same model flags. Its rounds are interleaved with the grid's (the
parent asks for one round at the start of each of its own rounds and waits,
idle, while the child runs it), so a busy neighbour slows the baseline and the
grid alike::

    parent (grid)   build ........ | wait | K=1 .. K=2 .. | wait | K=1 .. ...
    child (1 core)  build ..  ready| round|       idle    | round|   idle

The exchange is one JSON line each way, prefixed by ``_PREFIX`` so that
anything else the child prints on stdout is skipped: the child says
{"configs", "peak_memory_bytes"} when built, and answers every ``round``
line with {"seconds_per_step"}, one value per configuration. It exits when
its stdin closes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable, Sequence, TextIO

from gpipe_tf.runtime import devices as devices_lib
from tools.benchmark import lib

__all__ = ['BaselineError', 'Command', 'Configs', 'MeasureWithBaseline',
           'Serve', 'SingleCoreBaseline']

_PREFIX = 'single-core-baseline: '
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


class BaselineError(RuntimeError):
  """The single-core baseline process failed or broke the exchange."""


def Configs(inference: bool) -> list[dict]:
  """The baseline's configurations: training, and with ``inference`` forward only."""
  configs = [lib.Config(False, single_core=True)]
  if inference:
    configs.append(lib.Config(False, mode='inference', single_core=True))
  return configs


def Command(spec: lib.ModelSpec, steps_per_round: int,
            inference: bool) -> list[str]:
  """The command line of the child that times the baseline of ``spec``."""
  return [sys.executable, '-m', 'tools.benchmark', '--single_core_baseline',
          f'--block={spec.block}', f'--num_blocks={spec.num_blocks}',
          f'--dim={spec.dim}', f'--seq_len={spec.seq_len}',
          f'--batch_size={spec.batch_size}',
          f'--steps_per_round={steps_per_round}',
          '--inference' if inference else '--noinference']


def Serve(spec: lib.ModelSpec, steps_per_round: int, inference: bool,
          requests: TextIO, replies: TextIO) -> None:
  """The child's side: builds the baseline, then times a round per request.

  The CPU must already be one device with one thread
  (gpipe_tf.runtime.devices.SplitCpu(1, 1, 1)).
  """
  configs = Configs(inference)
  steps, peaks, _ = lib.Build(spec, configs,
                              devices_lib.DefaultDevices()[:1])
  _Send(replies, configs=configs, peak_memory_bytes=peaks)
  for line in requests:
    if line.strip() != 'round':
      raise BaselineError(f'Unknown request {line.strip()!r}; expected '
                          "'round'.")
    _Send(replies, seconds_per_step=[lib.TimeRound(step, steps_per_round)
                                     for step in steps])


def MeasureWithBaseline(
    spec: lib.ModelSpec, configs: Sequence[dict], num_devices: int,
    rounds: int, steps_per_round: int, inference: bool,
    measure: Callable[[Sequence[Callable[[], None]]], list[dict]] | None = None
) -> tuple[list[dict], list[float]]:
  """lib.Measure with the single-core baseline timed in the same rounds.

  Args:
    measure: times the grid instead of lib.Measure (e.g. on worker
      processes, tools/benchmark/processes.py): called with the callables to
      run first in every round (lib.Measure's ``also_time``), returns rows.

  Returns:
    The baseline's rows (training, and with ``inference`` forward only)
    followed by the grid's, and the training baseline's examples/sec in every
    round.
  """
  with SingleCoreBaseline(spec, steps_per_round, inference) as base:
    if measure is None:
      rows = lib.Measure(spec, configs, num_devices, rounds, steps_per_round,
                         also_time=[base.Round])
    else:
      rows = measure([base.Round])
    return base.Rows() + rows, base.ExamplesPerSecOfRounds()


class SingleCoreBaseline:
  """The parent's side: starts the child and asks it for rounds.

  Use as a context manager; ``Round`` is meant for lib.Measure's
  ``also_time`` (see MeasureWithBaseline).
  """

  def __init__(self, spec: lib.ModelSpec, steps_per_round: int,
               inference: bool, command: Sequence[str] | None = None):
    self._spec = spec
    self._proc = subprocess.Popen(
        list(command or Command(spec, steps_per_round, inference)),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=_REPO_ROOT)
    self._configs = None
    self._peaks = None
    self._times = None

  def __enter__(self) -> SingleCoreBaseline:
    return self

  def __exit__(self, *exc_info) -> None:
    self.Close()

  def Round(self) -> None:
    """Times one round of every baseline configuration (waits for the child)."""
    self._WaitUntilBuilt()
    self._proc.stdin.write('round\n')
    self._proc.stdin.flush()
    for ts, t in zip(self._times, self._Receive()['seconds_per_step']):
      ts.append(t)

  def Rows(self) -> list[dict]:
    """The baseline's rows, like lib.Measure's, over the rounds timed so far."""
    if not self._times or not self._times[0]:
      raise BaselineError('No round of the single-core baseline was timed; '
                          'call Round first.')
    return lib.Rows(self._spec, self._configs, self._times, self._peaks)

  def ExamplesPerSecOfRounds(self) -> list[float]:
    """The training baseline's throughput in every round, in order."""
    return [self._spec.batch_size / t for t in (self._times or [[]])[0]]

  def Close(self) -> None:
    """Closes the child's stdin and waits for it to exit."""
    if self._proc.stdin and not self._proc.stdin.closed:
      self._proc.stdin.close()
    self._proc.wait()

  def _WaitUntilBuilt(self) -> None:
    if self._configs is None:
      ready = self._Receive()
      self._configs = ready['configs']
      self._peaks = ready['peak_memory_bytes']
      self._times = [[] for _ in self._configs]

  def _Receive(self) -> dict:
    for line in self._proc.stdout:
      if line.startswith(_PREFIX):
        return json.loads(line[len(_PREFIX):])
    raise BaselineError(
        'The single-core baseline process ended without answering (exit code '
        f'{self._proc.wait()}); its error is in the output above. Run it '
        f"alone: {' '.join(self._proc.args)}")


def _Send(replies: TextIO, **message) -> None:
  replies.write(_PREFIX + json.dumps(message) + '\n')
  replies.flush()
