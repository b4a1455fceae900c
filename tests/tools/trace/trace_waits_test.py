"""tools/trace/waits.py: where a traced step's devices wait (pure, over a hand-made timeline)."""

import tensorflow as tf

from gpipe_tf.pipeline import schedule as schedule_lib
from gpipe_tf.pipeline import trace as trace_lib
from tools.trace import waits as trace_waits

Action = schedule_lib.Action
F, B, W, BW = schedule_lib.F, schedule_lib.B, schedule_lib.W, schedule_lib.BW


def _Timeline(schedule, times):
  """A Timeline of `schedule` whose action a ran over times[a]."""
  actions = list(times)
  return trace_lib.Timeline(schedule, actions,
                            [times[a][0] for a in actions],
                            [times[a][1] for a in actions])


class TraceWaitsTest(tf.test.TestCase):

  def testAGapSplitsIntoTheWaitForDataAndWhatFollowsIt(self):
    # GPipe, K=2, M=1: device 0 waits for device 1's backward.
    timeline = _Timeline(schedule_lib.Make('gpipe', 2, 1, 1), {
        Action(F, 0, 0): (0.0, 1.0), Action(F, 1, 0): (1.5, 2.5),
        Action(BW, 1, 0): (2.5, 4.5), Action(BW, 0, 0): (5.0, 7.0)})
    dev0, dev1 = trace_waits.Waits(timeline)
    self.assertEqual(dev0.busy, 3.0)
    (wait,) = dev0.waits
    self.assertEqual(wait.actions, (Action(BW, 0, 0),))
    self.assertEqual(wait.waited_for, Action(BW, 1, 0))
    self.assertAlmostEqual(wait.on_data, 3.5)  # 1.0 -> 4.5
    self.assertAlmostEqual(wait.after_data, 0.5)  # 4.5 -> 5.0
    self.assertEqual(dev0.tail, 0.0)
    self.assertEqual(dev1.first_start, 1.5)
    self.assertEqual(dev1.tail, 2.5)
    self.assertEqual(dev1.waits[0].seconds, 0.0)
    report = trace_waits.WaitReport(timeline, top=1)
    self.assertIn('device 0: busy 3000.0 ms of 7000.0; waited 3500.0 ms on '
                  'data from the other devices and 500.0 ms after it', report)
    self.assertIn('BW0s0 at 5000.0 ms: waited 4000.0 ms (3500.0 on data for '
                  'BW0s1, 500.0 after)', report)

  def testJoinedActionsAreOneStepAndALocalGapIsNotData(self):
    # ZB-H1, K=2, M=2: the last stage's B and W joined share their stamps.
    schedule = schedule_lib.Make('zb_h1', 2, 2, 1)
    times = {}
    t = 0.0
    for d, acts in enumerate(schedule.actions):
      t = 0.0
      for a in acts:
        if a.kind == W and Action(B, a.stage, a.micro_batch) in times:
          times[a] = times[Action(B, a.stage, a.micro_batch)]
          continue
        times[a] = (t, t + 1.0)
        t += 2.0  # Each step waits 1.0 after the previous one.
    waits = trace_waits.Waits(_Timeline(schedule, times))
    for d, dw in enumerate(waits):
      steps = {times[a] for a in schedule.actions[d]}
      self.assertLen(dw.waits, len(steps) - 1)
      self.assertAlmostEqual(dw.busy, len(steps))
      for w in dw.waits:
        self.assertAlmostEqual(w.seconds, 1.0)
        if w.waited_for is None:
          self.assertEqual(w.on_data, 0.0)


if __name__ == '__main__':
  tf.test.main()
