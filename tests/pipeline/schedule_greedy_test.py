"""schedule/greedy.py: the list scheduler reproduces 1F1B, times its lists as the simulator does, and holds back forwards for memory."""

import random
import unittest

from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline.schedule import greedy
from gpipe_tf.pipeline.schedule import memory
from gpipe_tf.pipeline.schedule import simulate
from gpipe_tf.pipeline.schedule import vshape

# Per micro-batch: a kept forward holds 1 + 4, a deferred W's stash 4.
_STAGE = memory.StageBytes(input=1, activations=4, wcut=4)


class GreedyTest(unittest.TestCase):

  def _Build(self, k, m, options, limit=float('inf'), v=1, comm=0.0):
    s = k * v
    return greedy.Build(m, [1.0] * s, [1.0] * s, [1.0] * s, [_STAGE] * s,
                        False, comm, [limit] * k, options)

  def testWholeBackwardsWithOneFOneBsDepthAreOneFOneB(self):
    options = greedy.Options((0, 1, 2, 3), (4, 3, 2, 1), split=False)
    built = self._Build(4, 8, options)
    self.assertEqual(built.actions, [list(r) for r in
                                     schedule.Make('1f1b', 4, 8).actions])
    self.assertEqual(built.makespan, 3 * (8 + 4 - 1))

  def testItsMakespanIsTheSimulatorsUnpaced(self):
    rng = random.Random(7)
    for case in range(20):
      k, v, m = rng.randint(1, 4), rng.choice((1, 2)), rng.randint(1, 8)
      s = k * v
      placed = (tuple(vshape.VStageDevices(k)) if v == 2 and rng.random() < 0.5
                else tuple(i % k for i in range(s)))
      times = [[rng.uniform(0.5, 2) for _ in range(s)] for _ in range(3)]
      # No pace and W filling every gap: nothing holds a device back that
      # its list does not.
      options = greedy.Options(placed, None, rng.random() < 0.5,
                               rng.random() < 0.5, True, rng.random() < 0.5)
      comm = rng.choice((0.0, 0.2))
      built = greedy.Build(m, *times, [_STAGE] * s, False, comm,
                           [float('inf')] * k, options)
      with self.subTest(case=case):
        sched = schedule.Schedule(built.actions, m, placed)
        self.assertAlmostEqual(
            simulate.Simulate(sched, *times, comm).makespan, built.makespan)

  def testMemoryLimitHoldsBackForwards(self):
    options = greedy.Options((0, 1), None, split=False)
    built = self._Build(2, 6, options, limit=10)  # Two micro-batches of 5.
    sched = schedule.Schedule(built.actions, 6)
    peaks = memory.Profile(sched, [_STAGE] * 2,
                           memory.KeptForwards(sched, 'never')).step_peak
    self.assertEqual(max(peaks), 10)
    self.assertGreater(max(memory.Profile(
        sched := schedule.Schedule(self._Build(2, 6, options).actions, 6),
        [_STAGE] * 2, memory.KeptForwards(sched, 'never')).step_peak), 10)

  def testStuckReturnsNone(self):
    # Not even one micro-batch (5) fits in 4.
    self.assertIsNone(self._Build(2, 2, greedy.Options((0, 1), None, False),
                                  limit=4))


if __name__ == '__main__':
  unittest.main()
