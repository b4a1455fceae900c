"""The executed schedule: timestamps from a real step obey the GPipe clock table."""

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import core
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline import trace as trace_lib


class TraceTest(tf.test.TestCase):

  def testExecutedOrderFollowsSchedule(self):
    k, m = 3, 4
    layers = [core.FCLayer.Params().Set(name=f'fc{i}', input_dim=32,
                                        output_dim=32) for i in range(6)]
    pipe = PipeliningLayer.Params().Set(
        name='net', layers=layers, num_partitions=k, num_micro_batches=m,
        remat='always').Instantiate()
    x = tf.random.stateless_normal([64, 32], [1, 1])
    trace = trace_lib.ScheduleTrace()

    # Not tf.function: its automatic control dependencies would chain the
    # (stateful) timestamps in program order and serialise every task.
    def _Step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(pipe.FProp(x, training=True, trace=trace))
      grads = tape.gradient(loss, pipe.trainable_variables)
      return grads, trace.Tensors()

    _, (starts, ends) = trace_lib.TracedStep(_Step)()
    timeline = trace_lib.Timeline.FromValues(trace, starts.numpy(),
                                             ends.numpy())
    self.assertLen(timeline.tasks, 2 * k * m)
    when = {t: (s, e) for t, s, e in zip(timeline.tasks, timeline.start,
                                         timeline.end)}
    sched = schedule_lib.make_schedule('gpipe', k, m)
    for task in when:
      self.assertLessEqual(when[task][0], when[task][1])
      for dep in sched.dependencies(task):
        self.assertLessEqual(when[dep][1], when[task][0], f'{dep} -> {task}')
    # Each cell ran its tasks one at a time, in the schedule's order.
    for cell in range(k):
      order = sched.order_for_cell(cell)
      for a, b in zip(order, order[1:]):
        self.assertLessEqual(when[a][1], when[b][0], f'{a} then {b}')
    self.assertBetween(timeline.BubbleFraction(), 0.0, 1.0)
    self.assertAlmostEqual(timeline.TheoreticalBubble(), 2 / 6)
    ascii_chart = timeline.ToAscii(width=40)
    self.assertLen(ascii_chart.splitlines(), k)


if __name__ == '__main__':
  tf.test.main()
