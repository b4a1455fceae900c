"""Measures what stash/pop saves over tuple carrying: per-device bytes received and peak step memory of an imported Keras U-Net.

A Keras U-Net (three 2x2 poolings down, three upsamplings back, each
upsampling concatenated with the encoder tensor of its size: three nested
long skips) is converted twice with ``pipeline.FromKeras``: with
``skips=True`` (each skip stashed by the cell that makes it and popped by
the cell that reads it) and ``skips=False`` (every live tensor carried in
the tuple through every cell in between, as FromKeras did before). Each is
pipelined at K cells on K logical CPU devices and trained one step with the
loss inside (``ComputeLossAndGradients``), and for each the tool reports:

  * bytes received per device per step, counted on the step's graph traced
    with ``execution='unrolled'`` (pipeline/transfers.py: every tensor of
    rank >= 1 an op on one device reads from an op on another; the graph,
    not the engine's own tables, so a skip routed through a cell in between
    shows);
  * peak step memory: the most the process's allocator held during one step
    (default execution) beyond what it held before, as tools.benchmark
    measures it (get_memory_info; all logical devices share one allocator,
    so this is the total over the cells); with --skips_devices=processes
    every cell runs in a local worker process of its own
    (gpipe_tf.runtime.local_workers) and each device's own peak is read
    from its allocator: what a middle device holds of carried skips;
  * the median step time over --skips_steps steps, both variants
    interleaved.

    python -m tools.benchmark.skips                                # K=4, 1f1b and gpipe
    python -m tools.benchmark.skips --skips_schedules=1f1b --skips_micro_batches=8
    python -m tools.benchmark.skips --skips_devices=processes      # each device's peak
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from absl import app
from absl import flags

__all__ = ['Measure', 'UNet', 'main']

_K = flags.DEFINE_integer('skips_partitions', 4, 'K: cells, one logical '
                          'device each.')
_M = flags.DEFINE_integer('skips_micro_batches', 4, 'M.')
_BATCH = flags.DEFINE_integer('skips_batch_size', 16, 'Mini-batch.')
_SIZE = flags.DEFINE_integer('skips_image_size', 32, 'Image height = width.')
_WIDTH = flags.DEFINE_integer('skips_width', 8, 'Channels of the first '
                              'level (doubled at each level down).')
_SCHEDULES = flags.DEFINE_list('skips_schedules', ['1f1b', 'gpipe'],
                               'Schedules to measure.')
_REMAT = flags.DEFINE_string('skips_remat', 'never', 'Remat policy.')
_STEPS = flags.DEFINE_integer('skips_steps', 5, 'Timed steps per variant.')
_DEVICES = flags.DEFINE_enum(
    'skips_devices', 'shared', ['shared', 'processes'],
    "What a device is. 'shared': a logical CPU device of this process (all "
    "share one allocator: the peak is the cells' total). 'processes': a "
    'local worker process of its own (gpipe_tf.runtime.local_workers), '
    'with its own allocator: the peak of every device.')
_BALANCE = flags.DEFINE_list(
    'skips_balance', ['5', '4', '4', '4'],
    'Layers per cell (the 17 calls: the encoder in cell 0, the bottom in '
    'cell 1, one decoder level per later cell); empty: balanced by cost.')


def UNet(size: int = 32, width: int = 8) -> Any:
  """A Keras U-Net of three levels: 17 calls, three long skips."""
  import keras  # pylint: disable=g-import-not-at-top
  x = inputs = keras.Input((size, size, 3))
  skips = []
  for level in range(3):
    x = keras.layers.Conv2D(width << level, 3, padding='same',
                            activation='relu', name=f'down{level}')(x)
    skips.append(x)
    x = keras.layers.MaxPooling2D(2, name=f'pool{level}')(x)
  x = keras.layers.Conv2D(width << 3, 3, padding='same', activation='relu',
                          name='bottom')(x)
  for level in reversed(range(3)):
    x = keras.layers.UpSampling2D(2, name=f'up{level}')(x)
    x = keras.layers.Concatenate(name=f'cat{level}')([x, skips[level]])
    x = keras.layers.Conv2D(width << level, 3, padding='same',
                            activation='relu', name=f'dec{level}')(x)
  out = keras.layers.Conv2D(1, 1, name='out')(x)
  return keras.Model(inputs, out, name='unet')


def _LossFn(outputs, labels):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import loss as loss_lib  # pylint: disable=g-import-not-at-top
  return loss_lib.LossTerms(
      tf.reduce_mean(tf.square(outputs - labels), axis=[1, 2, 3]))


def Measure(model: Any, skips: bool, schedule: str, k: int, m: int,
            batch: int, remat: str, devices: list,
            balance: list | None = None, workers: Any = None) -> dict:
  """One variant's row: received bytes per device, peak MiB, step times.

  Args:
    model: the Keras model.
    skips: stash/pop (True) or tuple carrying (False).
    schedule, k, m, batch, remat, balance: the pipeline's.
    devices: cell i's device is devices[i].
    workers: the local_workers.LocalWorkers the devices are on, to read
      every device's own peak (None: the devices share this process's
      allocator).

  Returns:
    {'variant', 'schedule', 'received' (bytes per device, in device order),
     'peak_bytes' (the median of three steps' peaks, 'peaks'),
     'device_peaks' (with workers: per device, the median of its three
     steps' peaks), 'times' (seconds of each timed step, filled by the
     caller), 'step' (a callable running one more step), 'balance'}.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf import pipeline  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import transfers  # pylint: disable=g-import-not-at-top
  size = model.input_shape[1]
  x = tf.random.stateless_normal([batch, size, size, 3], seed=[1, 2])
  y = tf.random.stateless_normal([batch, size, size, 1], seed=[3, 4])
  params = pipeline.FromKeras(model, skips=skips)

  def _Pipe(execution):
    pipe = pipeline.PipeliningLayer.Params().Set(
        name='unet', layers=params, num_partitions=k, num_micro_batches=m,
        schedule=schedule, remat=remat, execution=execution,
        devices=devices[:k], balance=balance).Instantiate()
    pipeline.LoadKerasWeights(pipe, model)
    return pipe

  unrolled = _Pipe('unrolled')
  graph = tf.function(lambda: unrolled.ComputeLossAndGradients(
      x, y, _LossFn)[0]).get_concrete_function().graph
  by_device = transfers.ReceivedBytes(graph)
  received = [by_device.get(transfers.DeviceKey(d), 0) for d in devices[:k]]
  pipe = _Pipe('loop')
  step = tf.function(lambda: pipe.ComputeLossAndGradients(x, y, _LossFn)[0])
  step().numpy()  # Trace and warm up.
  peaks, device_peaks = [], []
  for _ in range(3):  # The executor's order, and so the peak, may vary.
    if workers is not None:
      before = workers.Memory(reset=True)
      step().numpy()
      device_peaks.append([a['peak'] - b['current'] for a, b in
                           zip(workers.Memory(), before)])
      peaks.append(sum(device_peaks[-1]))
      continue
    tf.config.experimental.reset_memory_stats('CPU:0')
    before = tf.config.experimental.get_memory_info('CPU:0')['current']
    step().numpy()
    peaks.append(tf.config.experimental.get_memory_info('CPU:0')['peak'] -
                 before)
  return dict(variant='stash/pop' if skips else 'tuple', schedule=schedule,
              received=received, peak_bytes=int(statistics.median(peaks)),
              peaks=peaks,
              device_peaks=[int(statistics.median(p))
                            for p in zip(*device_peaks)],
              times=[], step=step, balance=pipe.balance)


def _Time(step) -> float:
  start = time.perf_counter()
  step().numpy()
  return time.perf_counter() - start


def Table(rows: list[dict]) -> str:
  """The markdown table of measured rows (with each device's own peak when
  the rows have them: --skips_devices=processes)."""
  k = len(rows[0]['received'])
  own = bool(rows[0].get('device_peaks'))
  peak = 'peak step MiB, sum of devices' if own else 'peak step MiB'
  head = ('| schedule | variant | balance | ' +
          ' | '.join(f'recv dev {i} KiB' for i in range(k)) +
          ' | recv total KiB | ' +
          ''.join(f'peak dev {i} MiB | ' for i in range(k) if own) +
          f'{peak} (min-max of 3) | step ms |')
  lines = [head, '|' + '---|' * (k + 6 + (k if own else 0))]
  for r in rows:
    lines.append(
        f"| {r['schedule']} | {r['variant']} | {r['balance']} | " +
        ' | '.join(f'{b / 1024:.1f}' for b in r['received']) +
        f" | {sum(r['received']) / 1024:.1f} | " +
        ''.join(f'{b / 2**20:.2f} | ' for b in r.get('device_peaks') or ()) +
        f"{r['peak_bytes'] / 2**20:.2f} "
        f"({min(r['peaks']) / 2**20:.2f}-{max(r['peaks']) / 2**20:.2f}) | "
        f"{1000 * statistics.median(r['times']):.0f} |")
  return '\n'.join(lines)


def main(argv):
  del argv
  if _DEVICES.value == 'processes':
    from gpipe_tf.runtime import local_workers  # pylint: disable=g-import-not-at-top
    with local_workers.LocalWorkers(local_workers.Options(
        num_workers=_K.value)) as workers:
      print(f'--skips_devices=processes: {workers.Describe()}', flush=True)
      _Run(workers.Connect(), workers)
    return
  from gpipe_tf.runtime import devices as devices_lib  # pylint: disable=g-import-not-at-top
  _Run(devices_lib.SplitCpu(_K.value), None)


def _Run(devices: list, workers: Any) -> None:
  model = UNet(_SIZE.value, _WIDTH.value)
  rows = []
  for schedule in _SCHEDULES.value:
    balance = [int(n) for n in _BALANCE.value] or None
    pair = [Measure(model, skips, schedule, _K.value, _M.value,
                    _BATCH.value, _REMAT.value, devices, balance, workers)
            for skips in (True, False)]
    for _ in range(_STEPS.value):  # Interleaved: load slows both alike.
      for row in pair:
        row['times'].append(_Time(row['step']))
    rows += pair
  print(f'K={_K.value} M={_M.value} batch={_BATCH.value} '
        f'balance={_BALANCE.value or "by cost"} '
        f'image={_SIZE.value}px width={_WIDTH.value} remat={_REMAT.value} '
        f'devices={_DEVICES.value}')
  print(Table(rows))


if __name__ == '__main__':
  app.run(main)
