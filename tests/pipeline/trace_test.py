"""Traces of a real step: every action is stamped, without the stamps ordering anything."""

import json
import os
import tempfile

import test_utils  # pylint: disable=g-bad-import-order

test_utils.SetUpDevices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from gpipe_tf.layers import core
from gpipe_tf.layers import losses
from gpipe_tf.pipeline import PipeliningLayer
from gpipe_tf.pipeline import loss as loss_lib
from gpipe_tf.pipeline import trace as trace_lib


def _Pipe(schedule, k=3, m=4):
  layers = [core.FCLayer.Params().Set(name=f'fc{i}', input_dim=32,
                                      output_dim=32) for i in range(6)]
  return PipeliningLayer.Params().Set(
      name='net', layers=layers, num_partitions=k, num_micro_batches=m,
      remat='always', schedule=schedule).Instantiate()


def _LossFn(y, labels):
  return loss_lib.LossTerms(losses.SoftmaxCrossEntropy(y, labels))


class TraceTest(tf.test.TestCase):

  def _Timeline(self, pipe, inside):
    x = tf.random.stateless_normal([64, 32], [1, 1])
    labels = tf.zeros([64], tf.int32)
    trace = trace_lib.ScheduleTrace()

    # Not tf.function: its automatic control dependencies would chain the
    # (stateful) timestamps in program order and serialise every action.
    def _Step():
      if inside:
        _, _, grads = pipe.ComputeLossAndGradients(x, labels, _LossFn,
                                                   trace=trace)
      else:
        with tf.GradientTape() as tape:
          loss = tf.reduce_sum(pipe.FProp(x, training=True, trace=trace))
        grads = tape.gradient(loss, pipe.trainable_variables)
      return grads, trace.Tensors()

    _, (starts, ends) = trace_lib.TracedStep(_Step)()
    return trace_lib.Timeline.FromValues(trace, starts.numpy(), ends.numpy())

  def testEveryActionOfTheScheduleIsStamped(self):
    for schedule, inside in (('gpipe', False), ('1f1b', True),
                             ('zb_h1', True)):
      with self.subTest(schedule=schedule):
        pipe = _Pipe(schedule)
        timeline = self._Timeline(pipe, inside)
        self.assertCountEqual(
            timeline.actions,
            [a for row in pipe.schedule.actions for a in row])
        for s, e in zip(timeline.start, timeline.end):
          self.assertLessEqual(s, e)
        self.assertBetween(timeline.BubbleFraction(), 0.0, 1.0)
        self.assertLen(timeline.ToAscii(width=40).splitlines(), 3)

  def testSimulatedBubbleAndChromeTrace(self):
    timeline = self._Timeline(_Pipe('gpipe'), False)
    self.assertAlmostEqual(timeline.SimulatedBubble(), 2 / 6)  # (K-1)/(M+K-1)
    path = os.path.join(tempfile.mkdtemp(), 'trace.json')
    timeline.WriteChromeTrace(path)
    with open(path) as f:
      events = json.load(f)['traceEvents']
    tracks = {e['args']['name'] for e in events if e['ph'] == 'M'}
    self.assertEqual(tracks, {'device 0', 'device 1', 'device 2'})
    work = [e for e in events if e['ph'] == 'X']
    self.assertLen(work, 2 * 3 * 4)
    self.assertEqual({e['tid'] for e in work if e['name'] == 'F0'}, {0, 1, 2})
    self.assertTrue(all(e['dur'] >= 0 for e in work))

  def testStampsOnlyObserve(self):
    # The stamps add no edge into the step: no op of an action waits for one.
    pipe = _Pipe('1f1b')
    x = tf.random.stateless_normal([64, 32], [1, 1])
    trace = trace_lib.ScheduleTrace()

    def _Step():
      pipe.ComputeLossAndGradients(x, tf.zeros([64], tf.int32), _LossFn,
                                   trace=trace)
      return trace.Tensors()

    graph = trace_lib.TracedStep(_Step).graph
    stamps = {op for op in graph.get_operations() if op.type == 'Timestamp'}
    self.assertLen(stamps, 2 * 2 * 3 * 4)
    for op in graph.get_operations():
      if op.type in ('Timestamp', 'Pack') or op in stamps:
        continue
      for dep in list(op.control_inputs) + [i.op for i in op.inputs]:
        self.assertNotIn(dep, stamps, op.name)


if __name__ == '__main__':
  tf.test.main()
