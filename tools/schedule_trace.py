"""Draws the schedule of a real pipelined training step, as the GPipe paper's Figure 2c.

Runs a few training steps of a stack of FC blocks through PipeliningLayer with
a ScheduleTrace, takes the timestamps of the last step, and writes a PNG with
one row per device (forward tasks blue, backward tasks orange, labelled by
micro-batch), titled with the measured bubble fraction beside the theoretical
(K-1)/(M+K-1). Also prints an ASCII version.

    python -m tools.schedule_trace --partitions=2 --micro_batches=4 --out=schedule.png
"""

from __future__ import annotations


from absl import app
from absl import flags


_K = flags.DEFINE_integer('partitions', 2, 'K: cells (one logical device each).')
_M = flags.DEFINE_integer('micro_batches', 4, 'M: micro-batches.')
_REMAT = flags.DEFINE_enum('remat', 'always', ['always', 'except_last', 'never'],
                           'Remat policy.')
_NUM_BLOCKS = flags.DEFINE_integer('num_blocks', 16, 'FC blocks.')
_DIM = flags.DEFINE_integer('dim', 256, 'Width.')
_BATCH = flags.DEFINE_integer('batch_size', 1024, 'Mini-batch size.')
_OUT = flags.DEFINE_string('out', 'schedule.png', 'PNG to write.')


def main(argv):
  del argv
  from gpipe_tf.runtime import devices  # pylint: disable=g-import-not-at-top
  devices.SplitCpu(_K.value)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from gpipe_tf import layers  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import PipeliningLayer  # pylint: disable=g-import-not-at-top
  from gpipe_tf.pipeline import trace as trace_lib  # pylint: disable=g-import-not-at-top

  blocks = [layers.FCLayer.Params().Set(name=f'block{i}', input_dim=_DIM.value,
                                        output_dim=_DIM.value)
            for i in range(_NUM_BLOCKS.value)]
  pipe = PipeliningLayer.Params().Set(
      name='net', layers=blocks, num_partitions=_K.value,
      num_micro_batches=_M.value, remat=_REMAT.value).Instantiate()
  x = tf.random.stateless_normal([_BATCH.value, _DIM.value], [1, 2])
  trace = trace_lib.ScheduleTrace()

  def _Step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(pipe.FProp(x, training=True,
                                                 trace=trace)))
    grads = tape.gradient(loss, pipe.trainable_variables)
    return [tf.reduce_sum(g) for g in grads], trace.Tensors()

  step = trace_lib.TracedStep(_Step)
  for _ in range(3):  # Warm up; keep the last step.
    _, (starts, ends) = step()
  timeline = trace_lib.Timeline.FromValues(trace, starts.numpy(), ends.numpy())
  print(timeline.ToAscii())
  print(f'makespan {1000 * timeline.makespan:.1f} ms, measured bubble '
        f'{timeline.BubbleFraction():.2f}, theoretical (K-1)/(M+K-1) '
        f'{timeline.TheoreticalBubble():.2f}')
  _Draw(timeline, pipe.devices, _OUT.value)
  print(f'wrote {_OUT.value}')


def _Draw(timeline, device_names, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  k = timeline.num_cells
  fig, ax = plt.subplots(figsize=(12, 0.8 * k + 1.2))
  for t, s, e in zip(timeline.tasks, timeline.start, timeline.end):
    row = k - 1 - t.cell
    color = '#4c78a8' if t.kind == 'F' else '#f58518'
    ax.barh(row, (e - s) * 1000, left=s * 1000, height=0.8, color=color,
            edgecolor='black', linewidth=0.5)
    ax.text((s + e) * 500, row, f'{t.kind}{t.micro_batch}', ha='center',
            va='center', fontsize=7, color='white')
  ax.set_yticks(range(k))
  ax.set_yticklabels([f'cell {c} ({device_names[c].split("/")[-1]})'
                      for c in reversed(range(k))])
  ax.set_xlabel('time (ms)')
  ax.set_title(f'K={k}, M={timeline.num_micro_batches}: measured bubble '
               f'{timeline.BubbleFraction():.2f}, theoretical '
               f'{timeline.TheoreticalBubble():.2f}')
  fig.tight_layout()
  fig.savefig(path, dpi=100)


if __name__ == '__main__':
  app.run(main)
