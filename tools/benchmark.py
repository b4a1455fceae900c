"""Benchmarks a training step of a deep model over a grid of K, M and remat, in one run.

Measures examples/sec of a full training step (forward + backward + one SGD
update) and the peak memory the step allocates, for:
  * a plain SequentialLayer baseline (no pipeline), and
  * PipeliningLayer for every K in --partitions, M in --micro_batches and
    remat policy in --remat,
all in ONE process, interleaved round by round (so a busy neighbour slows every
configuration alike), with the CPU split into --num_devices logical devices,
each given its share of the cores (intra-op threads = cores // devices,
inter-op threads = devices).

Prints the paper's Table 2 (throughput normalised to K=2, M=1 with the same
remat policy, beside the bubble-bound ideal K*M/(M+K-1)) and Table 1 (peak
memory), then the target checks. --json PATH writes one row per configuration.

Peak memory is the most the process allocator held during one step beyond what
it held before the step (activations, gradients, temporaries; the weights and
optimizer slots are allocated before and are not included). All logical CPU
devices share one allocator, so this is the total over all cells.

    python tools/benchmark.py                      # 32 FC blocks, K in {1,2}
    python tools/benchmark.py --block=transformer  # 32 Transformer blocks
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_BLOCK = flags.DEFINE_enum('block', 'fc', ['fc', 'transformer'],
                           'Kind of the identical blocks.')
_NUM_BLOCKS = flags.DEFINE_integer('num_blocks', 32, 'Number of blocks (L).')
_DIM = flags.DEFINE_integer('dim', 256, 'Model width.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', 32, 'Transformer sequence length.')
_BATCH = flags.DEFINE_integer('batch_size', 2048,
                              'Mini-batch size N (sequences for transformer).')
_NUM_DEVICES = flags.DEFINE_integer('num_devices', 2,
                                    'Logical CPU devices to split into.')
_PARTITIONS = flags.DEFINE_list('partitions', ['1', '2'], 'Values of K.')
_MICRO = flags.DEFINE_list('micro_batches', ['1', '2', '4', '8'],
                           'Values of M.')
_REMAT = flags.DEFINE_list('remat', ['never', 'always', 'except_last'],
                           'Remat policies.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds per configuration.')
_STEPS = flags.DEFINE_integer('steps_per_round', 2, 'Steps per timed round.')
_JSON = flags.DEFINE_string('json', None, 'Write result rows to this path.')
_INFERENCE = flags.DEFINE_bool(
    'inference', True,
    'Also time inference (forward only, training=False) for remat=never.')


def _BlockParams(i):
  from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
  d = _DIM.value
  if _BLOCK.value == 'fc':
    return layers.FCLayer.Params().Set(name=f'block{i}', input_dim=d,
                                       output_dim=d, activation='RELU')
  return layers.TransformerEncoderLayer.Params().Set(
      name=f'block{i}', model_dim=d, hidden_dim=4 * d, num_heads=4)


def _Inputs():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  n, d = _BATCH.value, _DIM.value
  if _BLOCK.value == 'fc':
    return (tf.random.stateless_normal([n, d], [1, 2]),), [(None, d)]
  t = _SEQ_LEN.value
  x = tf.random.stateless_normal([n, t, d], [1, 2])
  return (x, tf.zeros([n, t])), [(None, t, d), (None, t)]


def _MakeStep(model, inference=False):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  opt = tf.keras.optimizers.SGD(1e-4)
  inputs, _ = _Inputs()

  if inference:

    @tf.function
    def _Infer():
      out = model.FProp(*inputs, training=False)
      y = out[0] if isinstance(out, tuple) else out
      return tf.reduce_mean(tf.square(y))

    return _Infer

  @tf.function
  def _Step():
    with tf.GradientTape() as tape:
      out = model.FProp(*inputs, training=True)
      y = out[0] if isinstance(out, tuple) else out
      loss = tf.reduce_mean(tf.square(y))
    variables = model.trainable_variables
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  return _Step


def _Configs():
  configs = [dict(pipeline=False, num_partitions=1, num_micro_batches=1,
                  remat='none', mode='train')]
  for k in map(int, _PARTITIONS.value):
    for m in map(int, _MICRO.value):
      for remat in _REMAT.value:
        configs.append(dict(pipeline=True, num_partitions=k,
                            num_micro_batches=m, remat=remat, mode='train'))
  if _INFERENCE.value:
    for k in map(int, _PARTITIONS.value):
      for m in map(int, _MICRO.value):
        configs.append(dict(pipeline=True, num_partitions=k,
                            num_micro_batches=m, remat='never',
                            mode='inference'))
  return configs


def _Build(cfg, input_shapes):
  from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
  from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
  blocks = [_BlockParams(i) for i in range(_NUM_BLOCKS.value)]
  if not cfg['pipeline']:
    return layers.SequentialLayer.Params().Set(name='net',
                                               layers=blocks).Instantiate()
  return pipeline.PipeliningLayer.Params().Set(
      name='net', layers=blocks, num_partitions=cfg['num_partitions'],
      num_micro_batches=cfg['num_micro_batches'], remat=cfg['remat'],
      input_shapes=input_shapes).Instantiate()


def _Ideal(k, m):
  return k * m / (m + k - 1)


def main(argv):
  del argv
  from gpipe_tf import devices  # pylint: disable=g-import-not-at-top
  devices.SplitCpu(_NUM_DEVICES.value)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  _, input_shapes = _Inputs()
  configs = _Configs()
  steps, peaks = [], []
  for cfg in configs:
    step = _MakeStep(_Build(cfg, input_shapes),
                     inference=cfg['mode'] == 'inference')
    step()  # Trace and warm up.
    tf.config.experimental.reset_memory_stats('CPU:0')
    before = tf.config.experimental.get_memory_info('CPU:0')['current']
    step().numpy()
    peaks.append(tf.config.experimental.get_memory_info('CPU:0')['peak'] -
                 before)
    steps.append(step)
    print(f'built {_Label(cfg)}', file=sys.stderr, flush=True)
  times = [[] for _ in configs]
  for _ in range(_ROUNDS.value):
    for i, step in enumerate(steps):
      start = time.perf_counter()
      for _ in range(_STEPS.value):
        loss = step()
      loss.numpy()
      times[i].append((time.perf_counter() - start) / _STEPS.value)
  rows = []
  for cfg, ts, peak in zip(configs, times, peaks):
    rows.append(dict(cfg, examples_per_sec=_BATCH.value / statistics.median(ts),
                     peak_memory_bytes=int(peak)))
  _Report(rows)
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump({'block': _BLOCK.value, 'num_blocks': _NUM_BLOCKS.value,
                 'dim': _DIM.value, 'batch_size': _BATCH.value,
                 'num_devices': _NUM_DEVICES.value, 'rows': rows}, f, indent=1)


def _Label(cfg):
  if not cfg['pipeline']:
    return 'SequentialLayer'
  label = (f"K={cfg['num_partitions']} M={cfg['num_micro_batches']} "
           f"remat={cfg['remat']}")
  return label + (' (inference)' if cfg['mode'] == 'inference' else '')


def _Find(rows, k, m, remat, mode='train'):
  for r in rows:
    if (r['pipeline'] and r['num_partitions'] == k and
        r['num_micro_batches'] == m and r['remat'] == remat and
        r['mode'] == mode):
      return r
  return None


def _Report(rows):
  print(f'\n{_NUM_BLOCKS.value} x {_BLOCK.value} blocks, dim {_DIM.value}, '
        f'batch {_BATCH.value}, {_NUM_DEVICES.value} logical devices, '
        f'{os.cpu_count()} cores\n')
  print('Table 2 (throughput, normalised to K=2 M=1 of the same remat; '
        'ideal K*M/(M+K-1) in brackets)')
  print('| remat | K | ' + ' | '.join(f'M={m}' for m in _MICRO.value) + ' |')
  print('|---|---|' + '---|' * len(_MICRO.value))
  for remat in _REMAT.value:
    ref = _Find(rows, 2, 1, remat)
    for k in map(int, _PARTITIONS.value):
      cells = []
      for m in map(int, _MICRO.value):
        r = _Find(rows, k, m, remat)
        rel = r['examples_per_sec'] / ref['examples_per_sec'] if ref else 0.0
        cells.append(f'{rel:.2f} ({_Ideal(k, m):.2f})' if k > 1 else
                     f'{rel:.2f}')
      print(f'| {remat} | {k} | ' + ' | '.join(cells) + ' |')
  if _INFERENCE.value:
    ref = _Find(rows, 2, 1, 'never', 'inference')
    for k in map(int, _PARTITIONS.value):
      cells = []
      for m in map(int, _MICRO.value):
        r = _Find(rows, k, m, 'never', 'inference')
        rel = r['examples_per_sec'] / ref['examples_per_sec'] if ref else 0.0
        cells.append(f'{rel:.2f} ({_Ideal(k, m):.2f})' if k > 1 else
                     f'{rel:.2f}')
      print(f'| inference | {k} | ' + ' | '.join(cells) + ' |')
  print('\nTable 1 (peak step memory, MiB; examples/sec)')
  print('| configuration | peak MiB | examples/sec |')
  print('|---|---|---|')
  for r in rows:
    print(f"| {_Label(r)} | {r['peak_memory_bytes'] / 2**20:.1f} | "
          f"{r['examples_per_sec']:.0f} |")
  _Targets(rows)


def _Targets(rows):
  """Prints the issue's performance targets, measured."""
  seq = rows[0]
  checks = []
  for mode in ('train', 'inference'):
    k2m1 = _Find(rows, 2, 1, 'never', mode)
    k2m8 = _Find(rows, 2, 8, 'never', mode)
    if k2m1 and k2m8:
      s = k2m8['examples_per_sec'] / k2m1['examples_per_sec']
      checks.append((f'{mode}: K=2 M=8 vs K=2 M=1 (remat never): {s:.2f}x, '
                     f'target >= 1.6x (ideal {_Ideal(2, 8):.2f})', s >= 1.6))
  k1 = _Find(rows, 1, 1, 'never')
  if k1:
    slow = seq['examples_per_sec'] / k1['examples_per_sec'] - 1
    checks.append((f'K=1 M=1 pipeline vs SequentialLayer: {100 * slow:+.1f}% '
                   'time, target <= +5%', slow <= 0.05))
  never1, always8 = _Find(rows, 2, 1, 'never'), _Find(rows, 2, 8, 'always')
  if never1 and always8 and never1['peak_memory_bytes'] > 0:
    frac = always8['peak_memory_bytes'] / never1['peak_memory_bytes']
    checks.append((f'peak memory remat always M=8 / remat never M=1 (K=2): '
                   f'{100 * frac:.0f}%, target <= 35%', frac <= 0.35))
  for k in map(int, _PARTITIONS.value):
    for m in map(int, _MICRO.value):
      a, n = _Find(rows, k, m, 'always'), _Find(rows, k, m, 'never')
      if a and n:
        extra = n['examples_per_sec'] / a['examples_per_sec'] - 1
        checks.append((f'recompute cost K={k} M={m}: {100 * extra:+.0f}% step '
                       'time, target <= +35%', extra <= 0.35))
  print('\nTargets')
  for text, ok in checks:
    print(f"  [{'ok' if ok else 'MISSED'}] {text}")


if __name__ == '__main__':
  app.run(main)
