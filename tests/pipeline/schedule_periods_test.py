"""Folding a tick program's repeats into loops (schedule/periods.py); pure Python."""

import itertools
import unittest

from gpipe_tf.pipeline import schedule
from gpipe_tf.pipeline.schedule import periods
from gpipe_tf.pipeline.schedule import ticks

S = periods.Segment


def _Program(name, k, m, v=1):
  sched = ticks.JoinBackward(schedule.Make(name, k, m, v))
  return sched, ticks.Lower(ticks.FuseLast(sched))


def _Plan(name, k, m, v=1, per_stage=None):
  sched, program = _Program(name, k, m, v)
  columns = periods.Columns(program)
  # Every tick costs 1: budgets in ticks.
  budget = (4 if per_stage is None else per_stage) * sched.num_stages
  return columns, periods.Fold(columns, budget), budget


def _Built(plan):
  """Ticks built outside a switch loop."""
  return sum(seg.period for seg in plan if seg.kind != periods.SWITCH)


_LIBRARY = [('gpipe', 1), ('1f1b', 1), ('zb_h1', 1), ('interleaved_1f1b', 2),
            ('interleaved_1f1b', 4), ('zbv', 2), ('dualpipe_v', 2)]


class FoldTest(unittest.TestCase):

  def testOneFOneBAsTheDocstringDraws(self):
    columns, plan, budget = _Plan('1f1b', 2, 8)
    self.assertEqual((len(columns), budget), (16, 8))
    self.assertEqual(plan, (S(periods.STATIC, 0, 3, 1),
                            S(periods.REPEAT, 3, 2, 6),
                            S(periods.STATIC, 15, 1, 1)))

  def testEverySegmentRunsTicksThatBuildAlike(self):
    for (name, v), k, m, per_stage in itertools.product(
        _LIBRARY, (2, 4), (4, 8, 32), (None, 8)):
      try:
        columns, plan, budget = _Plan(name, k, m, v, per_stage)
      except schedule.ScheduleError:  # dualpipe_v needs M >= 2K.
        continue
      with self.subTest(schedule=name, k=k, m=m, v=v, budget=budget):
        # In order, every tick once.
        self.assertEqual([seg.start for seg in plan],
                         [0] + [seg.end for seg in plan[:-1]])
        self.assertEqual(plan[-1].end, len(columns))
        self.assertLessEqual(_Built(plan), budget)
        for seg in plan:
          if seg.kind == periods.REPEAT:
            self.assertGreater(seg.repeats, 1)
            for t in range(seg.start, seg.end):
              self.assertEqual(
                  columns[t], columns[seg.start + (t - seg.start) % seg.period],
                  (seg, t))
          elif seg.kind == periods.STATIC:
            self.assertEqual(seg.repeats, 1)
          else:
            self.assertEqual(plan, (S(periods.SWITCH, 0, 1, len(columns)),))

  def testGraphStopsGrowingWithMicroBatches(self):
    # Past a few times K, the plan has the same segments at any M; 4 ticks
    # per stage fold the one-stage-per-device schedules, 8 every library
    # schedule.
    for (name, v), k, per_stage in itertools.product(_LIBRARY, (2, 4),
                                                     (None, 8)):
      with self.subTest(schedule=name, k=k, v=v, per_stage=per_stage):
        shapes = set()
        for m in (32, 64, 128):
          _, plan, _ = _Plan(name, k, m, v, per_stage)
          shapes.add(tuple((seg.kind, seg.period) for seg in plan))
        self.assertEqual(len(shapes), 1, shapes)
        kinds = {kind for kind, _ in shapes.pop()}
        if per_stage == 8 or (v == 1 and (k, name) != (4, 'zb_h1')):
          self.assertIn(periods.REPEAT, kinds)

  def testCostsWeighTheTicks(self):
    # 'ab' twice (a and b cost 10 each), then 'c' 6 times (1 each): 46 in
    # all, 21 folded.
    columns = [('a',), ('b',), ('a',), ('b',)] + [('c',)] * 6
    self.assertEqual(periods.Fold(columns, 21, [10] * 4 + [1] * 6),
                     (S(periods.REPEAT, 0, 2, 2), S(periods.REPEAT, 4, 1, 6)))
    # Built whole when every tick fits; a switch loop when the fold does not.
    self.assertEqual(periods.Fold(columns, 46, [10] * 4 + [1] * 6),
                     (S(periods.STATIC, 0, 10, 1),))
    self.assertEqual(periods.Fold(columns, 20, [10] * 4 + [1] * 6),
                     (S(periods.SWITCH, 0, 1, 10),))

  def testShortProgramsAreBuiltWhole(self):
    columns, plan, budget = _Plan('gpipe', 4, 4)
    self.assertLessEqual(len(columns), budget)
    self.assertEqual(plan, (S(periods.STATIC, 0, len(columns), 1),))

  def testNoBudgetRunsOneSwitchLoop(self):
    columns, _, _ = _Plan('1f1b', 2, 8)
    self.assertEqual(periods.Fold(columns, 0),
                     (S(periods.SWITCH, 0, 1, len(columns)),))
    self.assertEqual(periods.Fold([], 0), ())

  def testOverBudgetOnceFoldedRunsOneSwitchLoop(self):
    # 10 distinct ticks, one tick 20 times, 10 distinct ticks: folded, the
    # graph holds 21 ticks.
    columns = ([(i,) for i in range(10)] + [('a',)] * 20 +
               [(i,) for i in range(10, 20)])
    self.assertEqual(periods.Fold(columns, 21),
                     (S(periods.STATIC, 0, 10, 1), S(periods.REPEAT, 10, 1, 20),
                      S(periods.STATIC, 30, 10, 1)))
    self.assertEqual(periods.Fold(columns, 20),
                     (S(periods.SWITCH, 0, 1, 40),))

  def testPrefersTheRepeatThatSavesMost(self):
    # 'ab' twice then 'c' 6 times: both repeat; 'c' saves 5 ticks.
    columns = [('a',), ('b',), ('a',), ('b',)] + [('c',)] * 6
    self.assertEqual(periods.Fold(columns, 4),
                     (S(periods.REPEAT, 0, 2, 2), S(periods.REPEAT, 4, 1, 6)))


if __name__ == '__main__':
  unittest.main()
