"""Traces of a real step: every action stamped once, on its device in the schedule's order, without the stamps ordering anything."""

import collections
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
from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline import trace as trace_lib
from gpipe_tf.pipeline.schedule import action as action_lib

_WIDTH = 512  # Wide enough that each action's work dwarfs a stamp's jitter.
_BATCH = 1024
# Stamps only observe, so under thread contention a stamp can run up to one
# op late (measured 0.1 to 1.2 ms on 2 cores), which inverts neighbouring
# stamps of one device: orders are checked on what the interpreter records
# (ScheduleTrace.DeviceOrder), never on the stamps.


def _Pipe(schedule, k=2, m=4, execution='loop'):
  layers = [core.FCLayer.Params().Set(name=f'fc{i}', input_dim=_WIDTH,
                                      output_dim=_WIDTH) for i in range(2 * k)]
  return PipeliningLayer.Params().Set(
      name='net', layers=layers, num_partitions=k, num_micro_batches=m,
      remat='always', schedule=schedule, execution=execution).Instantiate()


def _LossFn(y, labels):
  return loss_lib.LossTerms(losses.SoftmaxCrossEntropy(y, labels))


def _Name(a):
  return f'{a.kind}{a.stage}.{a.micro_batch}'


class TraceTest(tf.test.TestCase):

  def _TracedStep(self, pipe, inside):
    """A traced training step (not yet run) and its trace."""
    x = tf.random.stateless_normal([_BATCH, _WIDTH], [1, 1])
    labels = tf.zeros([_BATCH], tf.int32)
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

    return trace_lib.TracedStep(_Step), trace

  def _Timeline(self, pipe, inside):
    """The trace and the timeline of the second run of a traced training
    step (the first one warms up)."""
    step, trace = self._TracedStep(pipe, inside)
    step()
    _, (starts, ends) = step()
    return trace, trace_lib.Timeline.FromValues(trace, starts.numpy(),
                                                ends.numpy())

  def _Intervals(self, timeline):
    return {a: (s, e) for a, s, e in zip(timeline.actions, timeline.start,
                                         timeline.end)}

  def testEveryActionOfTheScheduleIsRecordedOnce(self):
    for schedule, inside, execution in (('gpipe', False, 'unrolled'),
                                        ('1f1b', True, 'loop'),
                                        ('zb_h1', True, 'unrolled')):
      with self.subTest(schedule=schedule, execution=execution):
        pipe = _Pipe(schedule, execution=execution)
        _, timeline = self._Timeline(pipe, inside)
        want = [a for row in pipe.schedule.actions for a in row]
        self.assertLen(timeline.actions, len(want))
        self.assertCountEqual(timeline.actions, want)
        for a, s, e in zip(timeline.actions, timeline.start, timeline.end):
          self.assertLessEqual(s, e, _Name(a))

  def testEachDeviceRecordsItsActionsInTheSchedulesOrder(self):
    # What the interpreter built, device by device, in tick order: the
    # schedule's lists exactly, a joined B and W (zb_h1's stage 0) and a
    # fused F and backward (1f1b's last stage) included. The step is built,
    # not run.
    for schedule, execution in (('1f1b', 'loop'), ('zb_h1', 'loop'),
                                ('1f1b', 'unrolled'), ('zb_h1', 'unrolled')):
      with self.subTest(schedule=schedule, execution=execution):
        pipe = _Pipe(schedule, k=2, m=4, execution=execution)
        _, trace = self._TracedStep(pipe, inside=True)
        for d, want in enumerate(pipe.schedule.actions):
          self.assertEqual([_Name(a) for a in trace.DeviceOrder(d)],
                           [_Name(a) for a in want], f'device {d}')

  def testGPipeBubbleAndStageOrder(self):
    pipe = _Pipe('gpipe', execution='unrolled')
    trace, timeline = self._Timeline(pipe, False)
    # Every device runs the forwards in order, then the backwards reversed.
    f, bw = action_lib.F, action_lib.BW
    for d in range(2):
      self.assertEqual(
          trace.DeviceOrder(d),
          [action_lib.Action(f, d, m) for m in range(4)] +
          [action_lib.Action(bw, d, m) for m in reversed(range(4))])
    # Idle time there is (the fill and the drain), but the stamps bracket
    # the work: stamps that do not wait for an action's outputs give
    # near-zero intervals and a bubble near 1.
    self.assertGreater(timeline.BubbleFraction(), 0.0)
    self.assertLess(timeline.BubbleFraction(), 0.9)
    self.assertAlmostEqual(timeline.SimulatedBubble(), 1 / 5)  # (K-1)/(M+K-1)

  def testAsciiChart(self):
    # GPipe, K = 2, M = 2, at the simulator's unit times (F 1, BW 2): one
    # character per time unit, the forward's digit, the backward's letter.
    sched = schedule_lib.Make('gpipe', 2, 2)
    sim = schedule_lib.Simulate(sched)
    acts = [a for row in sched.actions for a in row]
    timeline = trace_lib.Timeline(sched, acts, [sim.start[a] for a in acts],
                                  [sim.end[a] for a in acts])
    self.assertEqual(timeline.ToAscii(width=9), '\n'.join([
        'dev 0: 01   bbaa',
        'dev 1:  01bbaa']))
    # Twice as wide: two characters per unit.
    self.assertEqual(timeline.ToAscii(width=18).splitlines()[1],
                     'dev 1:   0011bbbbaaaa')
    # A measured step draws one row per device, both kinds on each.
    _, measured = self._Timeline(_Pipe('gpipe', execution='unrolled'), False)
    rows = measured.ToAscii(width=400).splitlines()
    self.assertEqual([r[:7] for r in rows], ['dev 0: ', 'dev 1: '])
    for row in rows:
      self.assertLessEqual(len(row), 7 + 401)
      self.assertRegex(row[7:], '[0-9]')
      self.assertRegex(row[7:], '[a-d]')

  def testChromeTrace(self):
    pipe = _Pipe('gpipe', execution='unrolled')
    _, timeline = self._Timeline(pipe, False)
    path = os.path.join(tempfile.mkdtemp(), 'trace.json')
    timeline.WriteChromeTrace(path)
    with open(path) as f:
      events = json.load(f)['traceEvents']
    tracks = {e['tid']: e['args']['name'] for e in events if e['ph'] == 'M'}
    self.assertEqual(tracks, {0: 'device 0', 1: 'device 1'})
    work = [e for e in events if e['ph'] == 'X']
    # One complete event per action, on its device's track, named after it.
    self.assertCountEqual(
        [(e['tid'], e['name'], e['args']['stage'], e['args']['micro_batch'])
         for e in work],
        [(d, f'{a.kind}{a.micro_batch}', a.stage, a.micro_batch)
         for d, row in enumerate(pipe.schedule.actions) for a in row])
    at = self._Intervals(timeline)
    for e in work:
      a = action_lib.Action(e['cat'], e['args']['stage'],
                            e['args']['micro_batch'])
      self.assertAllClose([e['ts'], e['dur']],
                          [at[a][0] * 1e6, (at[a][1] - at[a][0]) * 1e6],
                          atol=1e-3)

  def testStampsOnlyObserve(self):
    # The stamps add no edge into the step: nothing but the stamps' own
    # bookkeeping (the end stamp, the TensorList of stamps, its read and the
    # final stack) depends on a stamp, in the step's graph or in the loop's
    # and branches' functions where execution='loop' puts them.
    keep = {'Timestamp', 'TensorListSetItem', 'TensorListGetItem', 'Pack'}
    for execution in ('loop', 'unrolled'):
      with self.subTest(execution=execution):
        pipe = _Pipe('1f1b', k=3, execution=execution)
        x = tf.random.stateless_normal([_BATCH, _WIDTH], [1, 1])
        trace = trace_lib.ScheduleTrace()

        def _Step(pipe=pipe, x=x, trace=trace):
          pipe.ComputeLossAndGradients(x, tf.zeros([_BATCH], tf.int32),
                                       _LossFn, trace=trace)
          return trace.Tensors()

        graph_def = trace_lib.TracedStep(_Step).graph.as_graph_def()
        num_stamps = 0
        for nodes in [graph_def.node] + [f.node_def for f in
                                         graph_def.library.function]:
          after = {n.name for n in nodes if n.op == 'Timestamp'}
          num_stamps += len(after)
          grew = True
          while grew:  # Everything downstream of a stamp.
            grew = False
            for n in nodes:
              if n.name not in after and any(
                  i.lstrip('^').split(':')[0] in after for i in n.input):
                after.add(n.name)
                grew = True
          self.assertEqual(
              collections.Counter(n.op for n in nodes if n.name in after
                                  and n.op not in keep), {})
        self.assertGreater(num_stamps, 0)


if __name__ == '__main__':
  tf.test.main()
