"""Measures what building a pipelined step costs as M grows, for each execution of the engine: 'loop' and 'unrolled'.

For a stack of Transformer encoder blocks pipelined over K logical devices,
and for every M and every execution (``loop``: ticks built whole up to a
budget, else folded into tf.while_loops (docs/pipeline.md); ``unrolled``:
the same steps, one copy per action),
it builds a fresh PipeliningLayer and times (in one process, one
configuration after another):

  * tracing: building the step's graph in Python (get_concrete_function);
  * first step: tracing plus the first call, which optimises and places the
    graph (what a user waits for before training starts);
  * steady step: after --warmup more steps of every mode, --steps rounds in
    which each mode of the same M runs one step in turn; the median (so a
    slow spell of the machine slows every mode alike);
  * graph ops: the number of ops in the traced step's graph;
  * steady step CPU: the process's CPU seconds per steady step (all threads;
    the median of the same rounds): the work a step costs, which another
    process's load moves much less than wall time.

    python -m tools.trace.cost                      # K=4, M in {4, 32}, 8 blocks
    python -m tools.trace.cost --modes=loop,unrolled --micro_batches=4,8,32
    python -m tools.trace.cost --schedule=1f1b --micro_batches=4,8,32
    python -m tools.trace.cost --schedule=interleaved_1f1b --virtual_stages=2

Ratios within one run are what count on a shared machine (the targets: first
step at M=32 within 1.5x of M=4; steady step no worse than the unrolled
graph's at M <= 8).
"""

from __future__ import annotations

import statistics
import time

from absl import app
from absl import flags

__all__ = ['Build', 'SteadySteps', 'main']

_K = flags.DEFINE_integer('partitions', 4, 'K: cells, one logical device each.')
_M = flags.DEFINE_list('micro_batches', ['4', '32'], 'Values of M.')
_BLOCKS = flags.DEFINE_integer('num_blocks', 8, 'Transformer blocks.')
_DIM = flags.DEFINE_integer('dim', 64, 'Model width.')
_SEQ = flags.DEFINE_integer('seq_len', 16, 'Sequence length.')
_BATCH = flags.DEFINE_integer('batch_size', 64, 'Mini-batch (sequences).')
_STEPS = flags.DEFINE_integer(
    'steps', 15, 'Steady steps timed per mode (median), interleaved across '
    'the modes of one M.')
_WARMUP = flags.DEFINE_integer('warmup', 3, 'Untimed steps before them.')
_SCHEDULE = flags.DEFINE_string('schedule', 'gpipe', 'Pipeline schedule.')
_V = flags.DEFINE_integer(
    'virtual_stages', 1, 'V: cells per device (interleaved_1f1b), K x V cells.')
_REMAT = flags.DEFINE_string('remat', 'always', 'Remat policy.')
_MODES = flags.DEFINE_list(
    'modes', ['unrolled', 'loop'],
    "Executions to time: 'unrolled', 'loop', 'folded', 'switch' "
    '(PipeliningLayer.execution; unrolled rows take minutes at large M).')
_BUDGET = flags.DEFINE_integer(
    'loop_budget', None, "The ops of steps the loop may build "
    '(gpipe_tf.pipeline.schedule.periods.DEFAULT_BUDGET when unset; 0: every '
    'program one switch loop).')
_MODE_PARAMS = {mode: dict(execution=mode)
                for mode in ('unrolled', 'loop', 'folded', 'switch')}


def Build(k: int, m: int, mode: str) -> tuple[dict, object]:
  """Builds one configuration's step and times its building; returns its row
  (without the steady step) and the step."""
  from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
  from tools.trace import transformer  # pylint: disable=g-import-not-at-top

  d, t, n = _DIM.value, _SEQ.value, _BATCH.value
  pipe = PipeliningLayer.Params().Set(
      name='net', layers=transformer.Blocks(_BLOCKS.value, d),
      num_partitions=k, num_micro_batches=m,
      remat=_REMAT.value, schedule=_SCHEDULE.value,
      num_virtual_stages=_V.value,
      input_shapes=transformer.InputShapes(d, t), **_MODE_PARAMS[mode],
      **({} if _BUDGET.value is None else dict(loop_budget=_BUDGET.value))
  ).Instantiate()
  _Step = transformer.TrainStep(pipe, d, t, n)  # pylint: disable=invalid-name

  start = time.perf_counter()
  _Step.get_concrete_function()
  traced = time.perf_counter() - start
  _Step().numpy()
  first = time.perf_counter() - start
  ops = len(_Step.get_concrete_function().graph.get_operations())
  return {'num_micro_batches': m, 'mode': mode, 'trace_s': traced,
          'first_step_s': first, 'graph_ops': ops}, _Step


def SteadySteps(steps: list, warmup: int, rounds: int
                ) -> list[tuple[float, float]]:
  """(wall, CPU) median seconds per step of each of `steps`, timed in
  interleaved rounds after `warmup` untimed steps of each.

  CPU seconds are the process's, over all its threads (time.process_time):
  the work a step costs, whatever runs beside it. Wall time also shows how
  well the devices overlap, but moves with the machine's load; CPU time
  moves much less.
  """
  for _ in range(warmup):
    for step in steps:
      step().numpy()
  times = [[] for _ in steps]
  cpu = [[] for _ in steps]
  for _ in range(rounds):
    for i, step in enumerate(steps):
      start, start_cpu = time.perf_counter(), time.process_time()
      step().numpy()
      times[i].append(time.perf_counter() - start)
      cpu[i].append(time.process_time() - start_cpu)
  return [(statistics.median(ts), statistics.median(cs))
          for ts, cs in zip(times, cpu)]


def main(argv):
  del argv
  from gpipe_tf.runtime import devices  # pylint: disable=g-import-not-at-top
  devices.SplitCpu(_K.value)
  for mode in _MODES.value:
    if mode not in _MODE_PARAMS:
      raise app.UsageError(f'unknown mode {mode!r}; use {list(_MODE_PARAMS)}')
  rows = []
  for m in _M.value:
    built = [Build(_K.value, int(m), mode) for mode in _MODES.value]
    steady = SteadySteps([step for _, step in built], _WARMUP.value,
                         _STEPS.value)
    for (row, _), (seconds, cpu) in zip(built, steady):
      rows.append(dict(row, steady_step_s=seconds, steady_step_cpu_s=cpu))
  print(f'K={_K.value}, {_BLOCKS.value} Transformer blocks (d={_DIM.value}, '
        f'T={_SEQ.value}), batch {_BATCH.value}, schedule {_SCHEDULE.value}'
        f"{f' V={_V.value}' if _V.value > 1 else ''}, "
        f'remat {_REMAT.value}')
  print('| M | mode | tracing (s) | first step incl. tracing (s) | '
        'steady step (ms) | graph ops | steady step CPU (ms) |')
  print('|---|---|---|---|---|---|---|')
  for r in rows:
    print(f"| {r['num_micro_batches']} | {r['mode']} | "
          f"{r['trace_s']:.1f} | {r['first_step_s']:.1f} | "
          f"{1000 * r['steady_step_s']:.0f} | {r['graph_ops']} | "
          f"{1000 * r['steady_step_cpu_s']:.0f} |")
  by = {(r['num_micro_batches'], r['mode']): r for r in rows}
  lo, hi = min(int(m) for m in _M.value), max(int(m) for m in _M.value)
  for mode in _MODES.value:
    ratio = by[(hi, mode)]['first_step_s'] / by[(lo, mode)]['first_step_s']
    print(f'{mode}: first step at M={hi} / M={lo}: {ratio:.2f}x '
          '(target <= 1.5x)')
  if 'unrolled' in _MODES.value:
    for m in sorted({int(m) for m in _M.value}):
      for key, what in [('steady_step_s', 'steady step'),
                        ('steady_step_cpu_s', 'CPU per step')]:
        base = by[(m, 'unrolled')][key]
        print(f'M={m}: {what} / unrolled: ' + ', '.join(
            f"{mode} {by[(m, mode)][key] / base:.2f}x"
            for mode in _MODES.value if mode != 'unrolled'))


if __name__ == '__main__':
  app.run(main)
