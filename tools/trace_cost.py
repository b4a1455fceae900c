"""Measures what building a pipelined step costs as M grows: unrolled cells vs cells traced once.

For a stack of Transformer encoder blocks pipelined over K logical devices,
and for every M and both ``trace_once`` settings, it builds a fresh
PipeliningLayer and times (in one process, one configuration after another):

  * tracing: building the step's graph in Python (get_concrete_function);
  * first step: tracing plus the first call, which optimises and places the
    graph (what a user waits for before training starts);
  * steady step: the median of the next steps;
  * graph ops: the number of ops in the traced step's graph.

    python -m tools.trace_cost                      # K=4, M in {4, 32}, 8 blocks
    python -m tools.trace_cost --micro_batches=4,8,16,32 --schedule=1f1b

Ratios within one run are what count on a shared machine (the target: first
step at M=32 within 1.5x of M=4 with trace_once; steady step no worse than the
unrolled graph's at M <= 8).
"""

from __future__ import annotations

import statistics
import time

from absl import app
from absl import flags

_K = flags.DEFINE_integer('partitions', 4, 'K: cells, one logical device each.')
_M = flags.DEFINE_list('micro_batches', ['4', '32'], 'Values of M.')
_BLOCKS = flags.DEFINE_integer('num_blocks', 8, 'Transformer blocks.')
_DIM = flags.DEFINE_integer('dim', 64, 'Model width.')
_SEQ = flags.DEFINE_integer('seq_len', 16, 'Sequence length.')
_BATCH = flags.DEFINE_integer('batch_size', 64, 'Mini-batch (sequences).')
_STEPS = flags.DEFINE_integer('steps', 5, 'Steady steps timed (median).')
_SCHEDULE = flags.DEFINE_string('schedule', 'gpipe', 'Pipeline schedule.')
_REMAT = flags.DEFINE_string('remat', 'always', 'Remat policy.')
_ONLY_TRACE_ONCE = flags.DEFINE_bool(
    'only_trace_once', False, 'Skip the unrolled rows (they take minutes at '
    'large M).')


def Measure(k: int, m: int, trace_once: bool) -> dict:
  """Times one configuration; returns its row."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import loss as loss_lib  # pylint: disable=g-import-not-at-top

  d, t, n = _DIM.value, _SEQ.value, _BATCH.value
  blocks = [layers.TransformerEncoderLayer.Params().Set(
      name=f'block{i}', model_dim=d, hidden_dim=4 * d, num_heads=4)
            for i in range(_BLOCKS.value)]
  pipe = PipeliningLayer.Params().Set(
      name='net', layers=blocks, num_partitions=k, num_micro_batches=m,
      remat=_REMAT.value, schedule=_SCHEDULE.value, trace_once=trace_once,
      input_shapes=[(None, t, d), (None, t)]).Instantiate()
  x = tf.random.stateless_normal([n, t, d], [1, 2])
  paddings = tf.zeros([n, t])
  opt = tf.keras.optimizers.SGD(1e-4)

  def _LossFn(outputs, _):
    y = outputs[0] if isinstance(outputs, tuple) else outputs
    return loss_lib.LossTerms(tf.reduce_mean(tf.square(y), axis=[1, 2]))

  @tf.function
  def _Step():
    loss, _, grads = pipe.ComputeLossAndGradients(
        (x, paddings), tf.zeros([n]), _LossFn)
    opt.apply_gradients(zip(grads, pipe.trainable_variables))
    return loss

  start = time.perf_counter()
  _Step.get_concrete_function()
  traced = time.perf_counter() - start
  _Step().numpy()
  first = time.perf_counter() - start
  times = []
  for _ in range(_STEPS.value):
    start = time.perf_counter()
    _Step().numpy()
    times.append(time.perf_counter() - start)
  ops = len(_Step.get_concrete_function().graph.get_operations())
  return {'num_micro_batches': m, 'trace_once': trace_once,
          'trace_s': traced, 'first_step_s': first, 'steady_step_s': statistics.median(times),
          'graph_ops': ops}


def main(argv):
  del argv
  from gpipe_tf.runtime import devices  # pylint: disable=g-import-not-at-top
  devices.SplitCpu(_K.value)
  modes = (True,) if _ONLY_TRACE_ONCE.value else (False, True)
  rows = [Measure(_K.value, int(m), once) for m in _M.value
          for once in modes]
  print(f'K={_K.value}, {_BLOCKS.value} Transformer blocks (d={_DIM.value}, '
        f'T={_SEQ.value}), batch {_BATCH.value}, schedule {_SCHEDULE.value}, '
        f'remat {_REMAT.value}')
  print('| M | trace_once | tracing (s) | first step incl. tracing (s) | '
        'steady step (ms) | graph ops |')
  print('|---|---|---|---|---|---|')
  for r in rows:
    print(f"| {r['num_micro_batches']} | {r['trace_once']} | "
          f"{r['trace_s']:.1f} | {r['first_step_s']:.1f} | "
          f"{1000 * r['steady_step_s']:.0f} | {r['graph_ops']} |")
  by = {(r['num_micro_batches'], r['trace_once']): r for r in rows}
  lo, hi = min(int(m) for m in _M.value), max(int(m) for m in _M.value)
  for once in modes:
    ratio = by[(hi, once)]['first_step_s'] / by[(lo, once)]['first_step_s']
    print(f'trace_once={once}: first step at M={hi} / M={lo}: {ratio:.2f}x'
          + ('  (target <= 1.5x)' if once else ''))


if __name__ == '__main__':
  app.run(main)
